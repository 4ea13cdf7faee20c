/**
 * An enqueueMany of many jobs (SET_WISE_MIN_ROWS or more) with ordering keys and no dedup keys does the
 * ordering trigger's work itself, set-wise: its keys locked first in a
 * statement of their own, then each job's ordering_seq (enqueue order per key)
 * and blocked flag (behind an earlier job of the key in the batch, or a stored
 * one that keeps the key) computed for the whole batch. What it computes is
 * what the trigger computes for the same jobs one at a time.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { defineJob, TransactionEndedError } from '../src/index.ts';
import { SET_WISE_MIN_ROWS } from '../src/jobs/enqueue.ts';
import { jobQueries } from '../src/jobs/queries.ts';
import { ingestQueries } from '../src/consumers/ingest-queries.ts';
import { fanOutQueries } from '../src/relay/fanout-queries.ts';
import { databaseUrl, testDatabases, type TestMailroom } from './helpers/databases.ts';
import { explainPrepared, itPlans, PLAN_MODES, sqlArray } from './helpers/plans.ts';
import { duringCompletionOfKey, keyOrder, orderingRows } from './helpers/ordering-rows.ts';

const step = defineJob<{ key: string; n: number }>('enqueue-ordering.step', { queue: 'eo' });
const single = defineJob<{ key: string; n: number }>('enqueue-ordering.single', { queue: 'eo-single' });

const jobRows = (t: TestMailroom) => orderingRows(t, `payload->>'n'`);

/** `items` and jobs of keys of their own after them (n from 1000), so that the batch is enqueued set-wise. */
const filled = (items: { key: string; n: number }[]) => [
  ...items,
  ...Array.from({ length: Math.max(0, SET_WISE_MIN_ROWS - items.length) }, (_, i) => ({ key: `filler-${i}`, n: 1000 + i })),
];

for (const db of testDatabases()) {
  describe(`enqueueMany with ordering keys on ${db.name}`, () => {
    it('queues each key in enqueue order behind a stored job of the key, and agrees with the per-row trigger', async () => {
      const t = await db.open();
      const { mailroom } = t;
      // Stored beforehand: x waiting (it keeps the key), y completed (it does not).
      for (const def of [step, single]) {
        await mailroom.enqueue(def, { key: 'x', n: 0 }, { orderingKey: 'x' });
        await mailroom.enqueue(def, { key: 'y', n: 0 }, { orderingKey: 'y' });
      }
      await t.sql(`UPDATE "${t.schema}".jobs SET state = 'completed', finished_at = now() WHERE ordering_key = 'y'`);
      const keys = ['x', 'y', 'z', 'y', 'x', 'z', 'y'];
      const items = filled(keys.map((key, i) => ({ key, n: i + 1 })));
      await mailroom.enqueueMany(step, items, { orderingKey: (d) => d.key });
      // The same jobs one at a time: each goes through the trigger.
      for (const item of items) await mailroom.enqueue(single, item, { orderingKey: item.key });
      const rows = await jobRows(t);
      for (const key of ['x', 'y', 'z']) assert.deepEqual(keyOrder(rows, 'eo', key), keyOrder(rows, 'eo-single', key), `key ${key}`);
      assert.deepEqual(keyOrder(rows, 'eo', 'x'), ['0:runnable', '1:blocked', '5:blocked'], 'behind the stored job of x');
      assert.deepEqual(keyOrder(rows, 'eo', 'y'), ['0:runnable', '2:runnable', '4:blocked', '7:blocked'], 'y\'s stored job is completed: the first new one runs');
      assert.deepEqual(keyOrder(rows, 'eo', 'z'), ['3:runnable', '6:blocked']);
      const locked = await t.sql<{ queue: string; key: string }>(`SELECT queue, key FROM "${t.schema}".ordering_keys ORDER BY queue, key`);
      assert.deepEqual(locked.filter((r) => r.queue === 'eo' && !r.key.startsWith('filler-')).map((r) => r.key), ['x', 'y', 'z']);
    });

    it('a batch with dedup keys goes through the trigger and skips the keys taken, without queueing behind them', async () => {
      const t = await db.open();
      const { mailroom } = t;
      const [first] = await mailroom.enqueueMany(step, [{ key: 'k', n: 1 }, { key: 'k', n: 2 }], { orderingKey: (d) => d.key, key: (d) => `d${d.n}` });
      const again = await mailroom.enqueueMany(step, [{ key: 'k', n: 1 }, { key: 'k', n: 3 }], { orderingKey: (d) => d.key, key: (d) => `d${d.n}` });
      assert.equal(again[0], first, 'the dedup key already taken answers with the stored job');
      assert.deepEqual(keyOrder(await jobRows(t), 'eo', 'k'), ['1:runnable', '2:blocked', '3:blocked']);
    });

    it(
      'a batch waits for a completion of its key in flight, then queues nothing behind the finished job',
      { skip: db.name === 'pglite' ? 'one connection: no two transactions at once' : false },
      async () => {
        const t = await db.open();
        const { mailroom } = t;
        await mailroom.enqueue(step, { key: 'k', n: 1 }, { orderingKey: 'k' });
        const batch = filled([{ key: 'k', n: 2 }, { key: 'j', n: 3 }, { key: 'k', n: 4 }]);
        const ids = await duringCompletionOfKey(t, 'k', () => mailroom.enqueueMany(step, batch, { orderingKey: (d) => d.key }));
        assert.equal(ids.length, batch.length);
        const rows = await jobRows(t);
        assert.deepEqual(keyOrder(rows, 'eo', 'k'), ['1:runnable', '2:runnable', '4:blocked'], 'behind a finished job, 2 would wait for ever');
        assert.deepEqual(rows.filter((r) => r.key === 'k').map((r) => r.state), ['completed', 'available', 'available']);
        assert.deepEqual(keyOrder(rows, 'eo', 'j'), ['3:runnable']);
      },
    );

    it('in a transaction that already ended, a keyed batch is refused and nothing is written', { skip: db.name === 'pglite' ? 'a pg client is needed' : false }, async () => {
      const t = await db.open();
      const client = new pg.Client({ connectionString: databaseUrl });
      await client.connect();
      try {
        await client.query('BEGIN');
        await client.query('COMMIT');
        await assert.rejects(t.mailroom.enqueueMany(step, filled([{ key: 'a', n: 1 }, { key: 'b', n: 2 }]), { tx: client, orderingKey: (d) => d.key }), TransactionEndedError);
      } finally {
        await client.end();
      }
      assert.deepEqual(await jobRows(t), []);
    });
    itPlans(db, 'a keyed batch probes the jobs of each key by index, even on statistics taken while the table was small', async (t, session) => {
      const jobs = `"${t.schema}".jobs`;
      const insertJobs = (n: number, state: string, from: number) =>
        session.query(
          `INSERT INTO ${jobs} (id, queue, type, state, max_attempts, payload, ordering_key, ordering_seq)
           SELECT gen_random_uuid(), 'eo', 'x.y', '${state}', 5, '{}', 'k' || g, g FROM generate_series(${from}, ${from + n - 1}) AS g`,
        );
      // Statistics taken with 10 jobs, then 20,000 completed and 2,000 waiting (other keys) added:
      // the planner believes there are a handful.
      await insertJobs(10, 'completed', 1);
      await session.query(`ANALYZE ${jobs}`);
      await insertJobs(20_000, 'completed', 11);
      await insertJobs(2_000, 'available', 30_000);
      const n = 200;
      const list = <T,>(value: (i: number) => T) => Array.from({ length: n }, (_, i) => value(i));
      const args = [
        sqlArray(list(() => crypto.randomUUID())),
        `'eo'`,
        `'enqueue-ordering.step'`,
        '0',
        'NULL',
        '0',
        '5',
        sqlArray(list(() => null)),
        'NULL',
        'NULL',
        `'[${list((i) => JSON.stringify({ n: i })).join(',')}]'`,
        sqlArray(list((i) => `k${i}`)),
        'false',
        'NULL',
        'NULL',
      ].join(', ');
      const { text } = jobQueries(`"${t.schema}"`).enqueueKeyed;
      for (const mode of PLAN_MODES) {
        await session.query('BEGIN');
        const plan = await explainPrepared(session, mode, 'enqueue_keyed', text, args);
        await session.query('ROLLBACK');
        assert.match(plan, /Insert on jobs \(actual rows=200 /, `${mode}:\n${plan}`);
        assert.doesNotMatch(plan, /Seq Scan on jobs|Hash/, `${mode}: no probe reads the whole table:\n${plan}`);
        assert.match(plan, /Scan using jobs_ordering(_holder)?_idx on jobs held .*loops=200\)\n\s+Index Cond: \(\(queue = (c\.queue|\(\$2\))\) AND \(ordering_key = (c\.key|u\.ordering_key)\)\)/, `${mode}: one probe of the key per job:\n${plan}`);
      }
    });
    itPlans(db, 'every set-wise lock statement (enqueue, fan-out, broker store) takes its keys in (queue, key) order, whatever plan removes the duplicates', async (t, session) => {
      // The release locks keys in (queue, key) order; a lock statement in another order could deadlock
      // with it. With sorting priced out, the duplicates go through a hash, whose order is no order:
      // only the statement's own ORDER BY then sorts the keys.
      await session.query('SET enable_sort = off');
      const keys = sqlArray(['b', 'a', 'c', 'a']);
      const statements = [
        { name: 'enqueue_lock', text: jobQueries(`"${t.schema}"`).lockEnqueueKeys.text, args: `'eo', ${keys}` },
        { name: 'ingest_lock', text: ingestQueries(`"${t.schema}"`).lockKeys.text, args: `${keys}, 'consumer.g'` },
        { name: 'fanout_lock', text: fanOutQueries(`"${t.schema}"`).lockKeys.text, args: `${sqlArray(['t', 't', 't', 't'])}, ${sqlArray(['1', '1', '1', '1'])}, ${keys}, NULL` },
      ];
      for (const { name, text, args } of statements) {
        for (const mode of PLAN_MODES) {
          const plan = await explainPrepared(session, mode, name, text, args, 'COSTS OFF');
          assert.match(plan, /HashAggregate/, `${name} ${mode}: the duplicates go through a hash here:\n${plan}`);
          assert.match(plan, /Subquery Scan on "\*SELECT\*"\n\s+->  Sort\n\s+Sort Key: [^\n]+\n\s+->  HashAggregate/, `${name} ${mode}: the hash's rows sorted (by queue and key) before they are locked:\n${plan}`);
        }
      }
    });
  });
}
