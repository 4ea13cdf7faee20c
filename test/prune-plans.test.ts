/**
 * Retention deletes each batch by primary key, whatever the statistics say:
 * written as `… IN (SELECT … LIMIT n)`, PostgreSQL planned a hash join that
 * read the whole table (outbox, inbox, jobs) once more for every batch it
 * deleted (at 200,000 rows: 19-26 ms a batch of 1,000 against 1.4-3.8).
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { defineEvent } from '../src/index.ts';
import { consumerQueries } from '../src/consumers/consumer-queries.ts';
import { outboxQueries } from '../src/events/outbox-queries.ts';
import { retentionQueries } from '../src/jobs/retention-queries.ts';
import { databaseUrl, testDatabases } from './helpers/databases.ts';

const noted = defineEvent<{ n: number }>('prune.item-noted', { version: 1 });
const ROWS = 20_000;

for (const db of testDatabases()) {
  describe(`retention plans on ${db.name}`, () => {
    it(
      'outbox, inbox and job retention delete each batch by primary key, in custom and generic plans alike',
      { skip: db.name === 'pglite' ? 'needs a session of its own to hold prepared statements' : false },
      async () => {
        const t = await db.open();
        const s = `"${t.schema}"`;
        const session = new pg.Client({ connectionString: databaseUrl });
        await session.connect();
        try {
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
          await session.query(`ANALYZE ${s}.outbox`);
          await session.query(`ANALYZE ${s}.inbox`);
          await session.query(`ANALYZE ${s}.jobs`);
          const day = 86_400_000;
          const batches = [
            ['outbox', outboxQueries(s).prune.text, `${day}, 1000`],
            ['inbox', consumerQueries(s).pruneInbox.text, `'g', ${day}, 1000`],
            ['jobs', retentionQueries(s).pruneByAge.text, `'{completed}', ${day}, 1000`],
          ] as const;
          for (const mode of ['force_custom_plan', 'force_generic_plan']) {
            await session.query(`SET plan_cache_mode = ${mode}`);
            for (const [table, text, args] of batches) {
              await session.query(`PREPARE prune_${table}_${mode} AS ${text}`);
              await session.query('BEGIN');
              const { rows } = await session.query<{ 'QUERY PLAN': string }>(`EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE prune_${table}_${mode}(${args})`);
              const { rows: left } = await session.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${s}.${table}`);
              await session.query('ROLLBACK');
              const plan = rows.map((r) => r['QUERY PLAN']).join('\n');
              assert.equal(left[0]!.n, ROWS - 1000, `${table}, ${mode}: one batch of 1,000 deleted`);
              // The rows to delete are found by primary key: never a join hashing the whole table.
              assert.match(plan, new RegExp(`Delete on ${table} \\(actual rows=0 loops=1\\)\\n(.*\\n)*\\s+->  (Bitmap Heap Scan on ${table}|Index Scan using ${table}_pkey on ${table}) \\(actual rows=1000 loops=1\\)`), `${table}, ${mode}:\n${plan}`);
              assert.doesNotMatch(plan, /Hash/, `${table}, ${mode}:\n${plan}`);
            }
          }
        } finally {
          await session.end();
        }
      },
    );
  });
}
