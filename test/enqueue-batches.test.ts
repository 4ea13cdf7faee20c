/**
 * How a batch's payloads travel: as one JSON array per statement (the driver
 * escapes nothing), each job getting its own payload back unchanged, and a
 * batch with more payload than one statement carries written in several
 * statements of one transaction: all of it or none.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { defineJob } from '../src/index.ts';
import { STATEMENT_PAYLOAD_CHARS } from '../src/jobs/enqueue.ts';
import { testDatabases } from './helpers/databases.ts';

/** Payloads whose JSON text holds what an array literal or a naive join would get wrong. */
const AWKWARD: unknown[] = [
  { quote: 'say "hi"', backslash: 'C:\\temp\\new', both: '\\"' },
  { commas: 'a,b,c', brackets: '[1,2]', braces: '{"x":1}', escapes: '\\u0000 is text here' },
  [1, 'two', { three: [3] }],
  'a plain string',
  '',
  42,
  -0.5,
  true,
  null,
  { unicode: 'Grüße, 日本, 😀', newline: 'line one\nline two\ttab' },
  { nested: { deeper: { deepest: [null, false, 0, ''] } } },
  {},
  [],
];

for (const db of testDatabases()) {
  describe(`enqueueMany's payloads on ${db.name}`, () => {
    it('each job gets its own payload back unchanged, in the order given', async () => {
      const { mailroom } = await db.open();
      const job = defineJob<unknown>('batches.awkward', { queue: 'batches' });
      const ids = await mailroom.enqueueMany(job, AWKWARD);
      assert.equal(ids.length, AWKWARD.length);
      for (const [i, id] of ids.entries()) {
        assert.deepEqual((await mailroom.jobs.get(id))?.data, AWKWARD[i], `item ${i}`);
      }
      // With ordering keys from 64 jobs on, the batch takes the set-wise statement: the same payloads.
      const many = Array.from({ length: 65 }, (_, i) => AWKWARD[i % AWKWARD.length]);
      const keyed = await mailroom.enqueueMany(job, many, { orderingKey: (_, i) => `key-${i % 5}` });
      for (const [i, id] of keyed.entries()) {
        assert.deepEqual((await mailroom.jobs.get(id))?.data, many[i], `keyed item ${i}`);
      }
    });

    it('a batch with more payload than one statement carries is written whole, or not at all', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob<{ n: number; text: string }>('batches.large', { queue: 'batches-large' });
      // 40 payloads of about 900,000 characters: more than STATEMENT_PAYLOAD_CHARS, so two statements.
      const text = 'x'.repeat(900_000);
      const items = Array.from({ length: 40 }, (_, n) => ({ n, text }));
      assert.ok(items.length * text.length > STATEMENT_PAYLOAD_CHARS, 'the batch needs more than one statement');
      const ids = await mailroom.enqueueMany(job, items);
      assert.equal(new Set(ids).size, 40);
      const stored = await sql<{ id: string; n: number; len: number }>(
        `SELECT id, (payload->>'n')::int AS n, length(payload->>'text') AS len FROM "${schema}".jobs WHERE queue = 'batches-large'`,
      );
      assert.equal(stored.length, 40);
      const byId = new Map(stored.map((r) => [r.id, r]));
      ids.forEach((id, n) => assert.deepEqual({ n: byId.get(id)?.n, len: byId.get(id)?.len }, { n, len: 900_000 }, `job ${n}`));

      // The last job is refused by the database (a trigger of this test's schema): the first statement's
      // jobs, already inserted, go with it.
      await sql(
        `CREATE FUNCTION "${schema}".refuse_last() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.queue = 'batches-refused' AND (NEW.payload->>'n')::int = 39 THEN RAISE EXCEPTION 'job 39 refused by the test'; END IF;
           RETURN NEW;
         END $$`,
      );
      await sql(`CREATE TRIGGER refuse_last BEFORE INSERT ON "${schema}".jobs FOR EACH ROW EXECUTE FUNCTION "${schema}".refuse_last()`);
      const refused = defineJob<{ n: number; text: string }>('batches.refused', { queue: 'batches-refused' });
      await assert.rejects(mailroom.enqueueMany(refused, items), /job 39 refused by the test/);
      const [left] = await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE queue = 'batches-refused'`);
      assert.equal(left!.n, 0, 'nothing of the refused batch is stored');
      await sql(`DROP TRIGGER refuse_last ON "${schema}".jobs`);

      // In the caller's transaction the statements are part of it: rolled back with it.
      const inTx = defineJob<{ n: number; text: string }>('batches.in-tx', { queue: 'batches-in-tx' });
      await assert.rejects(
        mailroom.transaction(async (tx) => {
          await mailroom.enqueueMany(inTx, items, { tx });
          throw new Error('the caller rolls back');
        }),
        /the caller rolls back/,
      );
      const [rolledBack] = await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE queue = 'batches-in-tx'`);
      assert.equal(rolledBack!.n, 0, "nothing of a batch enqueued in a transaction that rolled back is stored");
    });
  });
}
