/**
 * Shared limits: a rate limit and a global concurrency cap enforced across
 * workers with their own connections, and RateLimitedError backing a queue off.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createMailroom, defineJob, RateLimitedError, ValidationError, type Job, type Mailroom, type Worker } from '../src/index.ts';
import { databaseUrl, testDatabases } from './helpers/databases.ts';
import { waitForEvents } from './helpers/events.ts';
import { controlQueries } from '../src/jobs/control-queries.ts';

/** On PostgreSQL each worker gets its own mailroom (own pool), as separate processes would. */
async function peers(db: ReturnType<typeof testDatabases>[number], main: Mailroom, schema: string, n: number): Promise<Mailroom[]> {
  if (db.name !== 'postgres') return Array.from({ length: n }, () => main);
  return Promise.all(Array.from({ length: n }, () => createMailroom({ database: databaseUrl!, schema, poolSize: 3 })));
}

/** Resolves when the workers together emitted `count` completions; fails after `timeoutMs`. */
function completions(workers: Worker[], count: number, timeoutMs = 60_000): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    let seen = 0;
    const timer = setTimeout(() => reject(new Error(`timed out waiting for ${count} completions; saw ${seen}`)), timeoutMs);
    for (const w of workers) {
      w.on('completed', () => {
        if (++seen === count) {
          clearTimeout(timer);
          resolve();
        }
      });
    }
  });
}

function maxInWindow(times: number[], windowMs: number): number {
  const sorted = [...times].sort((a, b) => a - b);
  let best = 0;
  for (let i = 0, j = 0; i < sorted.length; i++) {
    while (sorted[i]! - sorted[j]! >= windowMs) j++;
    best = Math.max(best, i - j + 1);
  }
  return best;
}

for (const db of testDatabases()) {
  describe(`shared limits on ${db.name}`, () => {
    it('a rate limit holds across workers: never more than max starts in any window', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob('limits.rate', { queue: 'rated' });
      await mailroom.enqueueMany(job, Array.from({ length: 30 }, (_, n) => ({ n })));
      const rooms = await peers(db, mailroom, schema, 4);
      const workers = rooms.map((m) =>
        m.worker({ queues: ['rated'], concurrency: 10, pollInterval: 20, rateLimit: { max: 5, per: '250ms' }, handlers: { [job.name]: () => {} } }),
      );
      const done = completions(workers, 30);
      await Promise.all(workers.map((w) => w.start()));
      await done;
      await Promise.all(workers.map((w) => w.stop()));
      const rows = await sql<{ ms: number }>(`SELECT (extract(epoch FROM started_at) * 1000)::float8 AS ms FROM "${schema}".jobs`);
      assert.equal(rows.length, 30);
      const busiest = maxInWindow(rows.map((r) => r.ms), 250);
      assert.ok(busiest <= 5, `at most 5 starts in any 250 ms window, saw ${busiest}`);
      if (db.name === 'postgres') await Promise.all(rooms.map((m) => m.close()));
    });

    it('a global concurrency cap holds across workers', async () => {
      const { mailroom, schema } = await db.open();
      const job = defineJob('limits.concurrency', { queue: 'capped' });
      await mailroom.enqueueMany(job, Array.from({ length: 24 }, (_, n) => ({ n })));
      const rooms = await peers(db, mailroom, schema, 3);
      let running = 0;
      let peak = 0;
      const handler = async () => {
        peak = Math.max(peak, ++running);
        await new Promise((r) => setTimeout(r, 15));
        running--;
      };
      const workers = rooms.map((m) => m.worker({ queues: ['capped'], concurrency: 5, pollInterval: 10, globalConcurrency: 2, handlers: { [job.name]: handler } }));
      const done = completions(workers, 24);
      await Promise.all(workers.map((w) => w.start()));
      await done;
      await Promise.all(workers.map((w) => w.stop()));
      assert.ok(peak <= 2, `at most 2 active at once across 3 workers of concurrency 5, saw ${peak}`);
      if (db.name === 'postgres') await Promise.all(rooms.map((m) => m.close()));
    });

    it('under a global concurrency cap, a finished job lets the next one start at once, not at the next poll', async () => {
      const { mailroom } = await db.open();
      const job = defineJob<{ n: number }>('limits.next', { queue: 'one-at-a-time' });
      await mailroom.enqueueMany(job, [{ n: 0 }, { n: 1 }, { n: 2 }]);
      // The cap leaves each claim short of the worker's room, as a queue with nothing waiting would; a
      // short claim is otherwise no reason to look again after a job. The poll (1 minute) must not be what
      // starts the next job: the completion that frees the cap's room does.
      const worker = mailroom.worker({
        queues: ['one-at-a-time'],
        concurrency: 4,
        pollInterval: '1m',
        globalConcurrency: 1,
        handlers: { [job.name]: () => new Promise((r) => setTimeout(r, 300)) },
      });
      // Three jobs of 300 ms one after another: well within 10 s, and far from the poll.
      const done = completions([worker], 3, 10_000);
      await worker.start();
      await done;
      await worker.stop();
    });

    it('RateLimitedError backs the whole queue off and spends no attempt', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob<{ n: number }>('limits.429', { queue: 'provider', retry: { maxAttempts: 1 } });
      await mailroom.enqueue(job, { n: 0 });
      let throttled = false;
      const worker = mailroom.worker({
        queues: ['provider'],
        concurrency: 1,
        pollInterval: 10,
        handlers: {
          [job.name]: async (j: Job<{ n: number }>) => {
            if (j.data.n === 0 && !throttled) {
              throttled = true;
              await mailroom.enqueueMany(job, [{ n: 1 }, { n: 2 }]);
              throw new RateLimitedError('429 from provider', { after: 300 });
            }
          },
        },
      });
      const limited = waitForEvents(worker, 'rate-limited', 1);
      const done = waitForEvents(worker, 'completed', 3);
      await worker.start();
      await limited;
      const [pause] = await sql<{ until_ms: number }>(`SELECT (extract(epoch FROM paused_until) * 1000)::float8 AS until_ms FROM "${schema}".queue_controls WHERE queue = 'provider'`);
      await done;
      await worker.stop();
      const rows = await sql<{ n: number; attempt: number; ms: number }>(
        `SELECT (payload->>'n')::int AS n, attempt, (extract(epoch FROM started_at) * 1000)::float8 AS ms FROM "${schema}".jobs ORDER BY n`,
      );
      assert.deepEqual(rows.map((r) => [r.n, r.attempt]), [[0, 1], [1, 1], [2, 1]], 'no attempt spent (maxAttempts 1 and still completed)');
      for (const r of rows) assert.ok(r.ms >= pause!.until_ms - 1, `job ${r.n} started after the back-off ended`);
    });

    it('limits live in the database until a worker removes them with null; a back-off that ended no longer routes claims through the lock', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob<{ n: number }>('limits.removed', { queue: 'removable' });
      await mailroom.enqueueMany(job, [{ n: 1 }, { n: 2 }, { n: 3 }]);
      const handlers = { [job.name]: () => {} };
      const limited = mailroom.worker({ queues: ['removable'], pollInterval: 10, rateLimit: { max: 1, per: '1h' }, handlers });
      const first = waitForEvents(limited, 'completed', 1);
      await limited.start();
      await first;
      await limited.stop();
      // A worker that gives no limit keeps the one in the database: nothing more starts this hour.
      const plain = mailroom.worker({ queues: ['removable'], pollInterval: 10, handlers });
      await plain.start();
      await new Promise((resolve) => setTimeout(resolve, 300));
      await plain.stop();
      const waiting = await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE queue = 'removable' AND state = 'available'`);
      assert.equal(waiting[0]!.n, 2, 'the limit outlives the worker that set it');
      // `rateLimit: null` removes it.
      const freed = mailroom.worker({ queues: ['removable'], pollInterval: 10, rateLimit: null, handlers });
      const rest = waitForEvents(freed, 'completed', 2);
      await freed.start();
      await rest;
      await freed.stop();
      const [row] = await sql<{ rate_max: number | null; concurrency: number | null }>(`SELECT rate_max, concurrency FROM "${schema}".queue_controls WHERE queue = 'removable'`);
      assert.deepEqual(row, { rate_max: null, concurrency: null });
      // Which queues claim through their control row: a limit, or a back-off still running.
      const { controlledAmong } = controlQueries(`"${schema}"`);
      const controlled = async () => (await sql<{ queue: string }>(controlledAmong.text, [['removable', 'paused', 'was-paused']])).map((r) => r.queue).sort();
      await sql(
        `INSERT INTO "${schema}".queue_controls (queue, paused_until) VALUES ('paused', now() + interval '1 hour'), ('recently-paused', now() - interval '1 second'), ('was-paused', now() - interval '61 minutes')`,
      );
      assert.deepEqual(await controlled(), ['paused'], 'limits removed, and a back-off that ended over an hour ago, no longer route claims through the lock');
      const all = async () => (await sql<{ queue: string }>(controlledAmong.text, [['paused', 'recently-paused', 'was-paused']])).map((r) => r.queue).sort();
      assert.deepEqual(await all(), ['paused', 'recently-paused'], 'a back-off that ended within the hour still routes claims through the lock (another 429 is seen at once)');
      await sql(`UPDATE "${schema}".queue_controls SET concurrency = 2 WHERE queue = 'was-paused'`);
      assert.deepEqual(await controlled(), ['paused', 'was-paused']);
    });

    it('refuses non-positive limits', async () => {
      const { mailroom } = await db.open();
      const handlers = { x: () => {} };
      for (const bad of [{ rateLimit: { max: 0, per: '1s' } }, { rateLimit: { max: 5, per: 0 } }, { rateLimit: { max: 1.5, per: '1s' } }, { globalConcurrency: 0 }, { globalConcurrency: -3 }]) {
        assert.throws(() => mailroom.worker({ queues: ['q'], handlers, ...(bad as object) }), (e: unknown) => e instanceof ValidationError && /rateLimit|globalConcurrency/.test(e.message));
      }
    });
  });
}
