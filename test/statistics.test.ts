/**
 * mailroom analyzes its growing tables where autovacuum does not (PGlite, a
 * server with autovacuum off): a claim planned while the jobs table was a
 * page or two otherwise keeps reading the whole table for the life of the
 * connection, however large the history grows.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { defineEvent, defineJob } from '../src/index.ts';
import { jobQueries } from '../src/jobs/queries.ts';
import { MIN_PAGES } from '../src/storage/statistics.ts';
import { testDatabases, type TestMailroom } from './helpers/databases.ts';
import { itPlans } from './helpers/plans.ts';

const chore = defineJob<{ n: number; pad: string }>('statistics.chore', { queue: 'stats' });
const PAD = 'x'.repeat(200);
const noted = defineEvent<{ n: number; pad: string }>('statistics.noted', { version: 1 });

/** A table's size now and as its statistics last recorded it, in pages. */
async function pagesOf(t: TestMailroom, table = 'jobs'): Promise<{ now: number; recorded: number }> {
  const [row] = await t.sql<{ now: number; recorded: number }>(
    `SELECT (pg_relation_size(c.oid) / current_setting('block_size')::int)::int AS now, c.relpages AS recorded
       FROM pg_class AS c WHERE c.oid = $1::regclass`,
    [`"${t.schema}".${table}`],
  );
  return row!;
}

/** Waits until the table's statistics record some pages. */
async function analyzedWithin(t: TestMailroom, table: string, ms: number): Promise<void> {
  const deadline = Date.now() + ms;
  while ((await pagesOf(t, table)).recorded === 0) {
    assert.ok(Date.now() < deadline, `${table} analyzed within ${ms / 1000} s`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function enqueue(t: TestMailroom, count: number): Promise<void> {
  for (let i = 0; i < count; i += 500) {
    await t.mailroom.enqueueMany(chore, Array.from({ length: Math.min(500, count - i) }, (_, n) => ({ n: i + n, pad: PAD })));
  }
}

for (const db of testDatabases()) {
  describe(`planner statistics on ${db.name}`, () => {
    it('a table is analyzed once it passes the minimum size and twice its recorded size, and then left until it doubles again', async () => {
      const t = await db.open();
      assert.deepEqual((await t.mailroom.maintain()).analyzed, [], 'an empty schema: nothing to analyze');
      await enqueue(t, 1500);
      const before = await pagesOf(t);
      assert.ok(before.now >= MIN_PAGES && before.recorded < before.now / 2, `grown past its statistics: ${JSON.stringify(before)}`);
      assert.deepEqual((await t.mailroom.maintain()).analyzed, ['jobs']);
      const after = await pagesOf(t);
      assert.equal(after.recorded, after.now, 'ANALYZE recorded the size');
      const [stats] = await t.sql<{ reltuples: number }>(`SELECT reltuples::int AS reltuples FROM pg_class WHERE oid = $1::regclass`, [`"${t.schema}".jobs`]);
      assert.equal(stats!.reltuples, 1500, 'and the row count');
      assert.deepEqual((await t.mailroom.maintain()).analyzed, [], 'not again while under twice that size');
      await enqueue(t, 500);
      assert.deepEqual((await t.mailroom.maintain()).analyzed, []);
      await enqueue(t, 2500);
      assert.deepEqual((await t.mailroom.maintain()).analyzed, ['jobs'], 'past twice the recorded size: analyzed again');
    });

    it("a running worker's maintenance loop analyzes the jobs table by itself", async () => {
      const t = await db.open({ rescueInterval: '50ms' });
      await enqueue(t, 1500);
      const worker = t.mailroom.worker({ queues: ['stats'], concurrency: 4, handlers: { [chore.name]: async () => {} } });
      await worker.start();
      try {
        await analyzedWithin(t, 'jobs', 10_000);
      } finally {
        await worker.stop();
      }
    });

    it('a relay in a process without a worker analyzes the outbox by itself', async () => {
      const t = await db.open();
      for (let i = 0; i < 1500; i += 500) await t.mailroom.publishMany(noted, Array.from({ length: 500 }, (_, n) => ({ n: i + n, pad: PAD })));
      assert.equal((await pagesOf(t, 'outbox')).recorded, 0);
      const relay = t.mailroom.relay({ to: [{ name: 'nowhere', publish: async () => {} }], internal: false });
      await relay.start();
      try {
        await analyzedWithin(t, 'outbox', 10_000); // checked at its start, then every 5 s
      } finally {
        await relay.stop();
      }
    });
  });

  describe(`cached plans after the statistics change on ${db.name}`, () => {
    itPlans(db, 'a claim planned on an empty table reads it whole until the check analyzes it; then it probes the primary key', async (first, session) => {
      // A session's cached plans are all rebuilt, from the tables' current sizes, when its plan cache is
      // reset (the shared invalidation queue overflowing under other test files' migrations: CI saw it
      // once). The stale plan then cannot be shown, and the scenario runs once more on a fresh schema.
      for (let attempt = 1; ; attempt++) {
        const t = attempt === 1 ? first : await db.open();
        const claim = jobQueries(`"${t.schema}"`).claim;
        const statement = `stale_claim_${attempt}`;
        const explainClaim = async (): Promise<string> => {
          await session.query('BEGIN');
          try {
            const { rows } = await session.query<{ 'QUERY PLAN': string }>(`EXPLAIN (COSTS OFF) EXECUTE ${statement}('stats', 1000, 30000, 'plan-test')`);
            return rows.map((r) => r['QUERY PLAN']).join('\n');
          } finally {
            await session.query('ROLLBACK');
          }
        };
        // The generic plan a connection settles on while the table is empty (as a worker's does after five claims).
        await session.query('SET plan_cache_mode = force_generic_plan');
        await session.query(`PREPARE ${statement} AS ${claim.text}`);
        const empty = await explainClaim();
        assert.match(empty, /Seq Scan on jobs j/, `on an empty table the generic plan reads it whole:\n${empty}`);
        await enqueue(t, 3000);
        await t.sql(`UPDATE "${t.schema}".jobs SET state = 'completed', finished_at = now() WHERE (payload->>'n')::int >= 100`);
        const stale = await explainClaim();
        if (attempt === 1 && !/Seq Scan on jobs j/.test(stale)) continue;
        assert.match(stale, /Seq Scan on jobs j/, `the cached plan stays while the statistics do not change (second try):\n${stale}`);
        assert.deepEqual((await t.mailroom.maintain()).analyzed, ['jobs']);
        const fresh = await explainClaim();
        assert.match(fresh, /(Index Scan using jobs_pkey on jobs j|Bitmap Index Scan on jobs_pkey)/, `replanned after ANALYZE:\n${fresh}`);
        assert.doesNotMatch(fresh, /Seq Scan on jobs j/, fresh);
        return;
      }
    });
  });
}
