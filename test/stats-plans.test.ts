/**
 * `stats()` reads the unfinished and dead jobs through indexes and never the
 * completed history: counted in one scan filtered on five states, PostgreSQL
 * read the whole jobs table once per call and once more per consumer group
 * (1.1 s for 2,800 such jobs and three groups beside 2,000,000 completed).
 * The counts are the same as that plain scan's, state by state.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { adminQueries } from '../src/jobs/admin-queries.ts';
import { consumerQueries } from '../src/consumers/consumer-queries.ts';
import { testDatabases, type TestMailroom } from './helpers/databases.ts';
import { explainPrepared, itPlans, PLAN_MODES } from './helpers/plans.ts';

const WAITING = `('available', 'scheduled', 'retrying')`;

/** The counts as one plain scan of the table gives them (the statement stats() used before). */
const plainCounts = (s: string) => `
  SELECT queue,
         count(*) FILTER (WHERE state IN ${WAITING} AND NOT blocked AND run_at <= now())::int AS available,
         count(*) FILTER (WHERE state = 'scheduled' AND NOT blocked AND run_at > now())::int AS scheduled,
         count(*) FILTER (WHERE state = 'retrying' AND NOT blocked AND run_at > now())::int AS retrying,
         count(*) FILTER (WHERE state IN ${WAITING} AND blocked)::int AS blocked,
         count(*) FILTER (WHERE state = 'active')::int AS active,
         count(*) FILTER (WHERE state = 'dead')::int AS dead,
         count(*) FILTER (WHERE state IN ('scheduled', 'available', 'active', 'retrying'))::int AS unfinished
    FROM ${s}.jobs GROUP BY queue ORDER BY queue`;

/** Jobs of `queue` in every state, blocked ones (by the ordering trigger) included. */
async function jobsInEveryState(t: TestMailroom, queue: string): Promise<void> {
  const s = `"${t.schema}"`;
  const rows: [state: string, runAt: string, finished: boolean][] = [
    ['available', `now() - interval '1 minute'`, false],
    ['available', `now() - interval '2 minutes'`, false],
    ['available', `now() + interval '1 hour'`, false],
    ['scheduled', `now() + interval '1 hour'`, false],
    ['scheduled', `now() - interval '1 second'`, false],
    ['retrying', `now() + interval '1 hour'`, false],
    ['retrying', `now() - interval '1 second'`, false],
    ['active', 'now()', false],
    ['dead', 'now()', true],
    ['dead', 'now()', true],
    ['completed', 'now()', true],
    ['cancelled', 'now()', true],
  ];
  for (const [state, runAt, finished] of rows) {
    await t.sql(
      `INSERT INTO ${s}.jobs (id, queue, type, state, max_attempts, payload, run_at, finished_at, locked_until)
       VALUES (gen_random_uuid(), $1, 'stats.plan', $2, 5, '{}', ${runAt}, ${finished ? 'now()' : 'NULL'}, ${state === 'active' ? `now() + interval '1 minute'` : 'NULL'})`,
      [queue, state],
    );
  }
  // One key: the first job holds it, the next two wait behind it, blocked (one due, one not).
  for (const runAt of [`now()`, `now()`, `now() + interval '1 hour'`]) {
    await t.sql(`INSERT INTO ${s}.jobs (id, queue, type, state, max_attempts, payload, run_at, ordering_key) VALUES (gen_random_uuid(), $1, 'stats.plan', 'available', 5, '{}', ${runAt}, 'k')`, [queue]);
  }
}

for (const db of testDatabases()) {
  describe(`stats() on ${db.name}`, () => {
    it('counts each state of each queue and group as one plain scan of the table does', async () => {
      const t = await db.open();
      const consumer = t.mailroom.consumer({ group: 'tally', handlers: { 'stats.other': () => {} } });
      await consumer.start();
      await consumer.stop();
      await jobsInEveryState(t, 'plain');
      await jobsInEveryState(t, 'consumer.tally');
      const expected = await t.sql<{ queue: string; available: number; scheduled: number; retrying: number; blocked: number; active: number; dead: number; unfinished: number }>(plainCounts(`"${t.schema}"`));
      assert.deepEqual(expected.map((r) => r.queue), ['consumer.tally', 'plain']);
      assert.equal(expected[1]!.blocked, 2, 'the ordering trigger blocked two jobs');
      const stats = await t.mailroom.stats();
      for (const { queue, unfinished, ...counts } of expected) {
        const { oldestAgeSeconds, completedPerSecond, failedPerSecond, ...got } = stats.queues[queue]!;
        assert.deepEqual(got, counts, queue);
        assert.ok(oldestAgeSeconds >= 120 && oldestAgeSeconds < 200, `${queue}: the oldest due job is two minutes old (${oldestAgeSeconds})`);
        if (queue === 'consumer.tally') assert.equal(stats.consumers.tally?.unfinished, unfinished);
        if (queue === 'consumer.tally') assert.equal(stats.consumers.tally?.dead, counts.dead);
      }
    });

    itPlans(db, 'reads unfinished and dead jobs through indexes, not the completed history, in custom and generic plans alike', async (t, session) => {
      const s = `"${t.schema}"`;
      const consumer = t.mailroom.consumer({ group: 'tally', handlers: { 'stats.other': () => {} } });
      await consumer.start();
      await consumer.stop();
      await jobsInEveryState(t, 'plain');
      await jobsInEveryState(t, 'consumer.tally');
      await t.sql(
        `INSERT INTO ${s}.jobs (id, queue, type, state, max_attempts, payload, finished_at)
         SELECT gen_random_uuid(), CASE WHEN n % 2 = 0 THEN 'plain' ELSE 'consumer.tally' END, 'stats.plan', 'completed', 5, '{}', now() - interval '1 hour'
           FROM generate_series(1, 20000) AS n`,
      );
      await t.sql(`ANALYZE ${s}.jobs`);
      const statements = [
        ['queue_counts', adminQueries(s).queueCounts.text, ''],
        ['group_stats', consumerQueries(s).groupStats.text, `'internal'`],
      ] as const;
      for (const mode of PLAN_MODES) {
        for (const [name, text, args] of statements) {
          const plan = await explainPrepared(session, mode, name, text, args);
          assert.doesNotMatch(plan, /Seq Scan on jobs/, `${name}, ${mode}:\n${plan}`);
          // No node of the plan reads more rows than there are unfinished and dead jobs (15 in each of the two queues).
          const reads = [...plan.matchAll(/on jobs(?: \w+)? \(actual rows=(\d+)/g)].map(([, read]) => Number(read));
          assert.ok(reads.length >= 3, `${name}, ${mode}: the plan's scans of jobs were found:\n${plan}`);
          for (const read of reads) assert.ok(read <= 30, `${name}, ${mode}: read ${read} rows:\n${plan}`);
        }
      }
    });
  });
}
