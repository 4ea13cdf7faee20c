/**
 * How often an idle worker claims: once a claim found less than it had room
 * for, new work announces itself (NOTIFY, the poll, the NOTIFY of a key's
 * next job unblocked by a completion), so finishing a job on a queue without
 * shared limits is no reason to claim again. It used to be: every job of a
 * trickle cost a second, empty claim (every keyed job, until session 26).
 */
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { createMailroom, defineJob, type Job } from '../src/index.ts';
import { databaseUrl, testDatabases, uniqueSchema } from './helpers/databases.ts';
import { waitForEvents } from './helpers/events.ts';

const chore = defineJob<{ n: number }>('claims.chore', { queue: 'claims' });
const JOBS = 30;

describe('claims of an idle worker', { skip: databaseUrl ? false : 'needs TEST_DATABASE_URL' }, () => {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 6 });
  const schema = uniqueSchema('claims');
  after(async () => {
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await pool.end();
  });

  for (const keyed of [false, true]) {
    it(`a trickle of jobs ${keyed ? 'with' : 'without'} ordering keys costs one claim per job, not two`, async () => {
      const mailroom = await createMailroom({ database: pool, schema });
      await mailroom.migrate();
      let claims = 0;
      const query = pool.query.bind(pool) as (...args: unknown[]) => unknown;
      (pool as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
        const config = args[0] as { name?: string } | string;
        if (typeof config === 'object' && config.name?.startsWith('mailroom_claim_')) claims++;
        return query(...args);
      };
      const worker = mailroom.worker({ queues: ['claims'], concurrency: 4, handlers: { [chore.name]: async () => {} } });
      await worker.start();
      try {
        await new Promise((r) => setTimeout(r, 300)); // idle: registered for NOTIFY, settled
        const before = claims;
        for (let n = 0; n < JOBS; n++) {
          const done = waitForEvents(worker, 'completed', 1);
          // Keyed: three keys in turn, each job's key free again by the time the next job of it comes.
          await mailroom.enqueue(chore, { n }, keyed ? { orderingKey: `key-${n % 3}` } : {});
          await done;
          await new Promise((r) => setTimeout(r, 20)); // the completion is written, the worker sleeps again
        }
        const perJob = (claims - before) / JOBS;
        // One claim per NOTIFY; a few more while the wake-up gate settles. Two per job before the change.
        assert.ok(perJob < 1.5, `${claims - before} claims for ${JOBS} jobs`);
      } finally {
        await worker.stop();
        await mailroom.close();
      }
    });
  }
});

for (const db of testDatabases()) {
  describe(`claims after a keyed job on ${db.name}`, () => {
    it("a finished job with an ordering key lets its key's next job start at once, not at the next poll", async () => {
      const { mailroom } = await db.open();
      const step = defineJob<{ n: number }>('claims.step', { queue: 'keyed-claims' });
      let releaseFirst!: () => void;
      const firstMayEnd = new Promise<void>((resolve) => (releaseFirst = resolve));
      const started: number[] = [];
      const worker = mailroom.worker({
        queues: ['keyed-claims'],
        concurrency: 4,
        pollInterval: '1m',
        handlers: {
          [step.name]: async (job: Job<{ n: number }>) => {
            started.push(job.data.n);
            if (job.data.n === 1) await firstMayEnd;
          },
        },
      });
      await worker.start();
      try {
        const firstStarted = new Promise<void>((resolve) => worker.once('started', () => resolve()));
        await mailroom.enqueue(step, { n: 1 }, { orderingKey: 'account-7' });
        await firstStarted;
        // Enqueued while the first runs: blocked behind it, so its NOTIFY finds nothing claimable and the
        // worker's claim comes back short. Only the first job's completion makes it claimable; the poll is
        // a minute away, so the worker must look again when that completion commits.
        await mailroom.enqueue(step, { n: 2 }, { orderingKey: 'account-7' });
        await new Promise((r) => setTimeout(r, 300)); // the NOTIFY's claim found nothing; the worker sleeps
        assert.deepEqual(started, [1]);
        const second = waitForEvents(worker, 'completed', 2, 10_000);
        releaseFirst();
        await second;
        assert.deepEqual(started, [1, 2]);
      } finally {
        releaseFirst();
        await worker.stop();
      }
    });
  });
}
