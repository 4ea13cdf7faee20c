/**
 * Retention deletes each batch by primary key (or ctid), whatever the
 * statistics say: written as `… IN (SELECT … LIMIT n)`, PostgreSQL planned a
 * hash join that read the whole table (outbox, inbox, jobs, key rows) once
 * more for every batch it deleted (at 200,000 rows: 19-26 ms a batch of 1,000
 * against 1.4-3.8).
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { defineEvent, defineJob } from '../src/index.ts';
import { consumerQueries } from '../src/consumers/consumer-queries.ts';
import { outboxQueries } from '../src/events/outbox-queries.ts';
import { retentionQueries } from '../src/jobs/retention-queries.ts';
import { testDatabases } from './helpers/databases.ts';
import { explainPrepared, itPlans, PLAN_MODES } from './helpers/plans.ts';

const noted = defineEvent<{ n: number }>('prune.item-noted', { version: 1 });
const ROWS = 20_000;

for (const db of testDatabases()) {
  describe(`retention plans on ${db.name}`, () => {
    it('count retention keeps the newest completed jobs of each queue (ties by id), in batches, and leaves other states and smaller queues alone', async () => {
      const t = await db.open({ retention: { completed: { count: 3 }, batchSize: 2 } });
      const s = `"${t.schema}"`;
      // Queue a: 8 completed, the three newest finished in one completion (the same finished_at); queue b: 2.
      const rows: [queue: string, state: string, minutesAgo: number][] = [
        ['a', 'completed', 9], ['a', 'completed', 8], ['a', 'completed', 7], ['a', 'completed', 6], ['a', 'completed', 5],
        ['a', 'completed', 1], ['a', 'completed', 1], ['a', 'completed', 1], ['a', 'dead', 20], ['a', 'available', 0],
        ['b', 'completed', 30], ['b', 'completed', 40],
      ];
      for (const [queue, state, ago] of rows) {
        await t.sql(
          `INSERT INTO ${s}.jobs (id, queue, type, state, max_attempts, payload, finished_at)
           VALUES (gen_random_uuid(), $1, 'prune.count', $2, 5, '{}', CASE WHEN $2 = 'available' THEN NULL ELSE date_trunc('minute', now()) - $3::int * interval '1 minute' END)`,
          [queue, state, ago],
        );
      }
      const newest = await t.sql<{ id: string }>(`SELECT id FROM ${s}.jobs WHERE queue = 'a' AND state = 'completed' ORDER BY finished_at DESC, id DESC LIMIT 3`);
      assert.equal((await t.mailroom.maintain()).pruned, 5);
      const left = await t.sql<{ queue: string; state: string; id: string }>(`SELECT queue, state, id FROM ${s}.jobs ORDER BY queue, state, id`);
      assert.deepEqual(left.filter((r) => r.queue === 'a' && r.state === 'completed').map((r) => r.id), newest.map((r) => r.id).sort());
      assert.deepEqual(left.map((r) => `${r.queue}:${r.state}`), ['a:available', 'a:completed', 'a:completed', 'a:completed', 'a:dead', 'b:completed', 'b:completed']);
    });

    it('key rows: an idle one older than an hour goes; a recent one, and an old one a waiting job holds, stay', async () => {
      const t = await db.open();
      const s = `"${t.schema}"`;
      const chore = defineJob<{ n: number }>('prune.chore', { queue: 'q' });
      await t.mailroom.enqueue(chore, { n: 1 }, { orderingKey: 'held' });
      await t.sql(
        `INSERT INTO ${s}.ordering_keys (queue, key, touched_at) VALUES ('q', 'idle', now() - interval '2 hours'), ('q', 'recent', now() - interval '5 minutes')`,
      );
      await t.sql(`UPDATE ${s}.ordering_keys SET touched_at = now() - interval '2 hours' WHERE key = 'held'`);
      await t.sql(`INSERT INTO ${s}.outbox_keys (key, touched_at) VALUES ('idle', now() - interval '2 hours'), ('recent', now() - interval '5 minutes')`);
      await t.mailroom.maintain();
      await t.mailroom.relay({ internal: false, to: [{ name: 'nowhere', publish: async () => {} }] }).prune();
      assert.deepEqual((await t.sql<{ key: string }>(`SELECT key FROM ${s}.ordering_keys ORDER BY key`)).map((r) => r.key), ['held', 'recent']);
      assert.deepEqual((await t.sql<{ key: string }>(`SELECT key FROM ${s}.outbox_keys ORDER BY key`)).map((r) => r.key), ['recent']);
    });

    itPlans(db, 'outbox, inbox, job and key-row retention delete each batch by primary key or ctid, in custom and generic plans alike', async (t, session) => {
      const s = `"${t.schema}"`;
      for (let i = 0; i < ROWS; i += 5000) await t.mailroom.publishMany(noted, Array.from({ length: 5000 }, (_, k) => ({ n: i + k })));
      // Half of each table older than its retention; every event passed by the (only) relay target.
      await session.query(`UPDATE ${s}.outbox SET created_at = now() - interval '2 days' WHERE position <= ${ROWS / 2}`);
      await session.query(`INSERT INTO ${s}.relay_cursors (target, cursor_xid, cursor_position) SELECT 'internal', max(xid), max(position) FROM ${s}.outbox`);
      await session.query(
        `INSERT INTO ${s}.inbox (consumer_group, event_id, received_at)
         SELECT 'g', gen_random_uuid(), now() - CASE WHEN n <= ${ROWS / 2} THEN interval '30 days' ELSE interval '0' END FROM generate_series(1, ${ROWS}) AS n`,
      );
      await session.query(
        `INSERT INTO ${s}.jobs (id, queue, type, state, max_attempts, payload, finished_at)
         SELECT gen_random_uuid(), 'q', 'a.b', 'completed', 5, '{}', now() - CASE WHEN n <= ${ROWS / 2} THEN interval '2 days' ELSE interval '0' END
           FROM generate_series(1, ${ROWS}) AS n`,
      );
      // Key rows (outbox keys, ordering keys): half idle for two hours, none held by a job.
      await session.query(`INSERT INTO ${s}.outbox_keys (key, touched_at) SELECT 'k' || n, now() - CASE WHEN n <= ${ROWS / 2} THEN interval '2 hours' ELSE interval '0' END FROM generate_series(1, ${ROWS}) AS n`);
      await session.query(`INSERT INTO ${s}.ordering_keys (queue, key, touched_at) SELECT 'q', 'k' || n, now() - CASE WHEN n <= ${ROWS / 2} THEN interval '2 hours' ELSE interval '0' END FROM generate_series(1, ${ROWS}) AS n`);
      for (const table of ['outbox', 'inbox', 'jobs', 'outbox_keys', 'ordering_keys']) await session.query(`ANALYZE ${s}.${table}`);
      const day = 86_400_000;
      const byKey = (table: string) => `(Bitmap Heap Scan on ${table}|Index Scan using ${table}_pkey on ${table})`;
      const batches = [
        ['outbox', outboxQueries(s).prune.text, `${day}, 1000`, byKey('outbox')],
        ['inbox', consumerQueries(s).pruneInbox.text, `'g', ${day}, 1000`, byKey('inbox')],
        ['jobs', retentionQueries(s).pruneByAge.text, `'{completed}', ${day}, 1000`, byKey('jobs')],
        ['outbox_keys', outboxQueries(s).pruneKeys.text, '1000', byKey('outbox_keys')],
        ['ordering_keys', retentionQueries(s).pruneIdleOrderingKeys.text, '1000', 'Tid Scan on ordering_keys k'],
      ] as const;
      for (const mode of PLAN_MODES) {
        for (const [table, text, args, scan] of batches) {
          await session.query('BEGIN');
          const plan = await explainPrepared(session, mode, `prune_${table}`, text, args);
          const { rows: left } = await session.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${s}.${table}`);
          await session.query('ROLLBACK');
          assert.equal(left[0]!.n, ROWS - 1000, `${table}, ${mode}: one batch of 1,000 deleted`);
          // The rows to delete are found by primary key (or ctid): never a join hashing the whole table.
          assert.match(plan, new RegExp(`Delete on ${table}( k)? \\(actual rows=0 loops=1\\)\\n(.*\\n)*\\s+->  ${scan} \\(actual rows=1000 loops=1\\)`), `${table}, ${mode}:\n${plan}`);
          assert.doesNotMatch(plan, new RegExp(`Hash (Semi )?Join|Seq Scan on ${table}${table === 'ordering_keys' ? ' k' : ''} \\(`), `${table}, ${mode}:\n${plan}`);
        }
        // Count retention: the pass finds each queue's cutoff once; a batch reads from the oldest
        // completed job up, through the finished index, and ranks nothing (no window, no sort).
        const { rows: cut } = await session.query<{ queue: string; finished_at: string; id: string }>(retentionQueries(s).completedCutoffs.text, [5000]);
        assert.equal(cut.length, 1, 'one queue has more than 5,000 completed jobs');
        const cutoff = `'{${cut[0]!.queue}}', '{"${cut[0]!.finished_at}"}', '{${cut[0]!.id}}', 1000`;
        await session.query('BEGIN');
        const plan = await explainPrepared(session, mode, 'prune_count', retentionQueries(s).pruneCompletedBeyond.text, cutoff);
        await session.query('ROLLBACK');
        assert.match(plan, /Index Scan using jobs_finished_idx on jobs j \(actual rows=1000 loops=1\)/, `count, ${mode}:\n${plan}`);
        assert.match(plan, /Delete on jobs \(actual rows=0 loops=1\)\n(.*\n)*\s+->  (Bitmap Heap Scan on jobs|Index Scan using jobs_pkey on jobs) \(actual rows=1000 loops=1\)/, `count, ${mode}:\n${plan}`);
        assert.doesNotMatch(plan, /WindowAgg|Sort|Seq Scan on jobs/, `count, ${mode}:\n${plan}`);
      }
    });
  });
}
