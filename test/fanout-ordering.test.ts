/**
 * The internal fan-out does the ordering trigger's work itself, set-wise
 * (migration 18): each group's jobs of a key get ordering_seq in event order,
 * the first runnable and the rest blocked behind it, or behind a stored job of
 * the key; a job already stored is left out before that count; and what it
 * computes is what the trigger computed for the same rows.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { defineEvent, type RelayedEvent } from '../src/index.ts';
import { fanOutQueries } from '../src/relay/fanout-queries.ts';
import { fanOut } from '../src/relay/internal-target.ts';
import { testDatabases, type TestMailroom } from './helpers/databases.ts';
import { flushUntil } from './helpers/relay.ts';
import { explainPrepared, itPlans, PLAN_MODES, sqlArray } from './helpers/plans.ts';
import { duringCompletionOfKey, keyOrder, orderingRows } from './helpers/ordering-rows.ts';

const noted = defineEvent<{ n: number }>('fanout.item-noted', { version: 1 });

const jobRows = (t: TestMailroom) => orderingRows(t, `payload->'data'->>'n'`);

/** Registers groups `names` for `noted` (their consumers started and stopped: the groups stay, nothing runs). */
async function groups(t: TestMailroom, names: string[]): Promise<void> {
  for (const group of names) {
    const consumer = t.mailroom.consumer({ group, handlers: { [noted.type]: async () => {} } });
    await consumer.start();
    await consumer.stop();
  }
}

/** An event as the relay hands it over, made by hand: `fanOut` can be called with it directly. */
function event(n: number, key: string | null): RelayedEvent {
  const id = crypto.randomUUID();
  const body = { specversion: '1.0', id, source: 'mailroom://test', type: noted.type, time: new Date().toISOString(), data: { n }, ...(key === null ? {} : { subject: key }) };
  // An xid past every snapshot: a group started before has not seen the event.
  return { position: String(n), xid: '9000000000', envelope: body as RelayedEvent['envelope'], body: JSON.stringify(body) };
}

for (const db of testDatabases()) {
  describe(`the fan-out's ordering on ${db.name}`, () => {
    it('queues each group\'s jobs of a key in event order: the first runnable, the rest behind it, and all behind a stored job of the key', async () => {
      const t = await db.open();
      await groups(t, ['audit', 'ledger']);
      const relay = t.mailroom.relay({ pollInterval: 20 });
      // A job of key c stored by an earlier batch: it keeps the key.
      await t.mailroom.publish(noted, { n: 0 }, { key: 'c' });
      await flushUntil(relay, 1);
      await t.mailroom.transaction(async (tx) => {
        await t.mailroom.publish(noted, { n: 1 }, { tx, key: 'a' });
        await t.mailroom.publish(noted, { n: 2 }, { tx, key: 'b' });
        await t.mailroom.publish(noted, { n: 3 }, { tx });
        await t.mailroom.publish(noted, { n: 4 }, { tx, key: 'a' });
        await t.mailroom.publish(noted, { n: 5 }, { tx, key: 'c' });
        await t.mailroom.publish(noted, { n: 6 }, { tx, key: 'a' });
      });
      await flushUntil(relay, 6);
      const rows = await jobRows(t);
      assert.equal(rows.length, 14, 'seven events, two groups');
      for (const queue of ['consumer.audit', 'consumer.ledger']) {
        assert.deepEqual(keyOrder(rows, queue, 'a'), ['1:runnable', '4:blocked', '6:blocked'], `${queue}: key a in event order`);
        assert.deepEqual(keyOrder(rows, queue, 'b'), ['2:runnable']);
        assert.deepEqual(keyOrder(rows, queue, 'c'), ['0:runnable', '5:blocked'], `${queue}: behind the stored job of c`);
        const unkeyed = rows.find((r) => r.queue === queue && r.n === 3)!;
        assert.deepEqual([unkeyed.seq, unkeyed.blocked], [null, false], 'a job without a key has no seq and is never blocked');
      }
      const keys = await t.sql<{ queue: string; key: string }>(`SELECT queue, key FROM "${t.schema}".ordering_keys ORDER BY queue, key`);
      assert.deepEqual(keys.map((k) => `${k.queue}/${k.key}`), ['consumer.audit/a', 'consumer.audit/b', 'consumer.audit/c', 'consumer.ledger/a', 'consumer.ledger/b', 'consumer.ledger/c']);
    });

    it('a batch fanned out again with a finished job of a key in it leaves that job out, and the next job of the key is runnable', async () => {
      const t = await db.open();
      await groups(t, ['ledger']);
      const queries = fanOutQueries(`"${t.schema}"`);
      const first = event(1, 'k');
      const second = event(2, 'k');
      assert.equal(await t.mailroom.transaction((tx) => fanOut(tx, queries, [first])), 1);
      await t.sql(`UPDATE "${t.schema}".jobs SET state = 'completed', finished_at = now() WHERE ordering_key = 'k'`);
      // A backfill overlapping the relay: the first event again, and the next.
      assert.equal(await t.mailroom.transaction((tx) => fanOut(tx, queries, [first, second])), 1, 'only the new job is inserted');
      const rows = await jobRows(t);
      assert.deepEqual(
        rows.map((r) => `${r.n}:${r.state}:${r.blocked ? 'blocked' : 'runnable'}`),
        ['1:completed:runnable', '2:available:runnable'],
        'nothing may queue behind a job that has finished',
      );
    });

    it('sets the same ordering_seq order and blocked flags as the per-row trigger does for the same rows', async () => {
      const t = await db.open();
      await groups(t, ['ledger']);
      const relay = t.mailroom.relay({ pollInterval: 20 });
      const keys = ['x', 'y', null, 'x', 'z', 'y', 'x', null, 'z'];
      await t.mailroom.transaction(async (tx) => {
        for (const [n, key] of keys.entries()) await t.mailroom.publish(noted, { n }, key === null ? { tx } : { tx, key });
      });
      await flushUntil(relay, keys.length);
      const fanned = await jobRows(t);
      // The same jobs inserted again, without a seq, so that the trigger does the work (another queue).
      await t.sql(
        `INSERT INTO "${t.schema}".jobs (id, queue, type, state, max_attempts, payload, ordering_key)
         SELECT gen_random_uuid(), 'by-trigger', type, 'available', 5, payload, ordering_key FROM "${t.schema}".jobs
          WHERE queue = 'consumer.ledger' ORDER BY (payload->'data'->>'n')::int`,
      );
      const triggered = await jobRows(t);
      for (const key of ['x', 'y', 'z']) {
        assert.deepEqual(keyOrder(fanned, 'consumer.ledger', key), keyOrder(triggered, 'by-trigger', key), `key ${key}`);
      }
      assert.deepEqual(keyOrder(fanned, 'consumer.ledger', 'x'), ['0:runnable', '3:blocked', '6:blocked']);
    });

    it('a fan-out waits for a completion of its key in flight, then queues nothing behind the finished job', { skip: db.name === 'pglite' ? 'one connection: no two transactions at once' : false }, async () => {
      const t = await db.open();
      await groups(t, ['ledger']);
      const queries = fanOutQueries(`"${t.schema}"`);
      await t.mailroom.transaction((tx) => fanOut(tx, queries, [event(1, 'k')]));
      assert.equal(await duringCompletionOfKey(t, 'k', () => t.mailroom.transaction((tx) => fanOut(tx, queries, [event(2, 'k')]))), 1);
      const rows = await jobRows(t);
      assert.deepEqual(rows.map((r) => `${r.n}:${r.state}:${r.blocked ? 'blocked' : 'runnable'}`), ['1:completed:runnable', '2:available:runnable'], 'blocked behind a finished job, it would wait for ever');
    });

    itPlans(db, 'a keyed fan-out probes the jobs by index for each event, even on statistics taken while the table was small', async (t, session) => {
      await groups(t, ['ledger']);
      const jobs = `"${t.schema}".jobs`;
      const insertJobs = (n: number) =>
        session.query(
          `INSERT INTO ${jobs} (id, queue, type, state, max_attempts, payload, ordering_key, ordering_seq)
           SELECT gen_random_uuid(), 'consumer.ledger', 'x.y', 'completed', 5, '{}', 'k' || g, g FROM generate_series(1, ${n}) AS g`,
        );
      // Statistics taken with 10 jobs, then 20,000 more (a group's completed history) and 2,000 waiting
      // behind other keys: the planner believes there are a handful.
      await insertJobs(10);
      await session.query(`ANALYZE ${jobs}`);
      await insertJobs(20_000);
      await session.query(
        `INSERT INTO ${jobs} (id, queue, type, state, max_attempts, payload, ordering_key, ordering_seq, blocked)
         SELECT gen_random_uuid(), 'consumer.ledger', 'x.y', 'available', 5, '{}', 'other' || (g % 100), 20000 + g, g > 100 FROM generate_series(1, 2000) AS g`,
      );
      const events = Array.from({ length: 200 }, (_, i) => event(i, `k${i}`));
      const args = [
        sqlArray(events.map((e) => e.envelope.id)),
        sqlArray(events.map(() => noted.type)),
        sqlArray(events.map((e) => e.xid)),
        sqlArray(events.map((e) => e.envelope.subject ?? null)),
        sqlArray(events.map(() => null)),
        sqlArray(events.map((e) => e.body ?? JSON.stringify(e.envelope))),
        'NULL',
      ].join(', ');
      const { text } = fanOutQueries(`"${t.schema}"`).fanOut;
      for (const mode of PLAN_MODES) {
        await session.query('BEGIN');
        const plan = await explainPrepared(session, mode, 'fanout', text, args);
        await session.query('ROLLBACK');
        assert.match(plan, /Tuples Inserted: 200\b/, `${mode}:\n${plan}`);
        assert.doesNotMatch(plan, /Seq Scan on jobs|Hash/, `${mode}: no probe reads the whole table:\n${plan}`);
        assert.match(plan, /Index (Only )?Scan using jobs_pkey on jobs j .*loops=200\)/, `${mode}: one primary-key probe per keyed job:\n${plan}`);
        assert.match(plan, /Scan using jobs_ordering(_holder)?_idx on jobs held .*loops=200\)\n\s+Index Cond: \(\(queue = g\.queue\) AND \(ordering_key = e\.subject\)\)/, `${mode}: one probe of the key per keyed job:\n${plan}`);
      }
    });
  });
}
