/**
 * After a round that found nothing more, the relay looks past its cursor with
 * a fresh fence: is a row below the fence (deliver again at once), does a
 * committed row wait behind it (held back)? Until session 40 this counted
 * every row past the cursor; a relay keeping up with busy publishers has
 * thousands there after each round, and the count took 29 % of a core of
 * PostgreSQL at 20,000 events/s. It is now two index probes of one row each.
 * Its answers are checked against plain counts, and its plans on PostgreSQL.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { defineEvent } from '../src/index.ts';
import { relayQueries } from '../src/relay/relay-queries.ts';
import { newId } from '../src/ids.ts';
import { testDatabases, type TestMailroom } from './helpers/databases.ts';
import { explainPrepared, itPlans, PLAN_MODES } from './helpers/plans.ts';

const noted = defineEvent<{ n: number }>('after-cursor.item-noted', { version: 1 });
/** An xid no transaction has reached: the row lies behind every fence, as if its transaction were still open. */
const FAR = '1000000000000000';

/** A row with the xid given (its position follows insert order). */
async function craft(t: TestMailroom, xid: string): Promise<void> {
  await t.sql(`INSERT INTO "${t.schema}".outbox (xid, id, type, version, source, time, data) VALUES ($1::xid8, $2, $3, 1, '/test', now(), '{}')`, [xid, newId(), noted.type]);
}

interface Look {
  ready: boolean;
  waiting: boolean;
}

/** The statement's answer from `cursor`, and the same question put as plain counts with its fence. */
async function lookBoth(t: TestMailroom, cursor: [xid: string, position: string]): Promise<{ look: Look; counted: Look; fence: string }> {
  const { afterCursor } = relayQueries(`"${t.schema}"`);
  const [row] = await t.sql<{ fence: string; ready: boolean; waiting: boolean }>(afterCursor.text, cursor);
  const [counts] = await t.sql<{ ready: number; waiting: number }>(
    `SELECT count(*) FILTER (WHERE xid < $3::xid8)::int AS ready, count(*) FILTER (WHERE xid >= $3::xid8)::int AS waiting
       FROM "${t.schema}".outbox WHERE (xid, position) > ($1::xid8, $2::bigint)`,
    [...cursor, row!.fence],
  );
  return { look: { ready: row!.ready, waiting: row!.waiting }, counted: { ready: counts!.ready > 0, waiting: counts!.waiting > 0 }, fence: row!.fence };
}

for (const db of testDatabases()) {
  describe(`the relay's look past its cursor on ${db.name}`, () => {
    it('says whether a row lies below the fence and whether one waits behind it, as counting them does, from every cursor', async () => {
      const t = await db.open();
      // Small xids: transactions long ended, below any fence (the migrations alone took more). Read order: 10, 20, 30, FAR, FAR.
      for (const xid of ['20', '10', FAR, '30', FAR]) await craft(t, xid);
      const rows = await t.sql<{ xid: string; position: string }>(`SELECT xid::text AS xid, position::text AS position FROM "${t.schema}".outbox AS o ORDER BY o.xid, o.position`);
      // Every cursor a relay can have here (none delivered, after each row in read order), and one at the far xid's start.
      const cursors: [string, string][] = [['0', '0'], ...rows.map((r): [string, string] => [r.xid, r.position]), [FAR, '0']];
      const answers: string[] = [];
      for (const cursor of cursors) {
        const { look, counted } = await lookBoth(t, cursor);
        assert.deepEqual(look, counted, `from cursor (${cursor.join(', ')})`);
        answers.push(`${look.ready ? 'ready' : '-'}/${look.waiting ? 'waiting' : '-'}`);
      }
      assert.deepEqual(answers, ['ready/waiting', 'ready/waiting', 'ready/waiting', '-/waiting', '-/waiting', '-/-', '-/waiting']);
    });

    it('finds a ready row when none waits, and nothing past a cursor at the fence', async () => {
      const t = await db.open();
      await craft(t, '10');
      await craft(t, '20');
      const from = await lookBoth(t, ['10', '0']);
      assert.deepEqual(from.look, { ready: true, waiting: false });
      assert.deepEqual(from.look, from.counted);
      const past = await lookBoth(t, [from.fence, '0']);
      assert.deepEqual(past.look, { ready: false, waiting: false });
      assert.deepEqual(past.look, past.counted);
    });

    itPlans(db, 'reads one index entry per probe in custom and generic plans, however many rows lie past the cursor', async (t, session) => {
      const s = `"${t.schema}"`;
      for (let i = 0; i < 20_000; i += 5000) await t.mailroom.publishMany(noted, Array.from({ length: 5000 }, (_, k) => ({ n: i + k })));
      for (let i = 0; i < 3; i++) await craft(t, FAR);
      await session.query(`ANALYZE ${s}.outbox`);
      const { afterCursor } = relayQueries(s);
      for (const mode of PLAN_MODES) {
        const plan = await explainPrepared(session, mode, 'after_cursor', afterCursor.text, `'0', '0'`);
        assert.doesNotMatch(plan, /Seq Scan|Bitmap|Aggregate/, `${mode}: a probe reads the table or counts:\n${plan}`);
        const scans = plan.split('\n').filter((line) => /Index (Only )?Scan/.test(line));
        assert.equal(scans.length, 2, `${mode}: two index probes:\n${plan}`);
        for (const line of scans) assert.match(line, /actual rows=1 loops=1/, `${mode}: each probe stops at its first row:\n${plan}`);
      }
    });
  });
}
