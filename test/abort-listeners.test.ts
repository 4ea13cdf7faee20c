/**
 * A busy worker keeps many statements in flight at once (claims,
 * completions, heartbeats, handler transactions), each listening to the
 * worker's stop signal until it ends: node must not take that for a leak
 * and print a MaxListenersExceededWarning (src/stop-controller.ts).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { defineJob, type Job, type JobContext } from '../src/index.ts';
import { testDatabases } from './helpers/databases.ts';
import { waitForEvents } from './helpers/events.ts';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

// PostgreSQL: PGlite serves one connection, so its handler transactions run one at a time.
for (const db of testDatabases().filter((d) => d.name === 'postgres')) {
  describe(`stop signals of a busy worker on ${db.name}`, () => {
    it('thirty handler transactions at once print no MaxListenersExceededWarning', { timeout: 60_000 }, async () => {
      const { mailroom } = await db.open({ poolSize: 40 });
      const job = defineJob<{ n: number }>(`listeners.${db.name}`, { queue: `listeners_${db.name}` });
      const warnings: string[] = [];
      const onWarning = (warning: Error) => void warnings.push(`${warning.name}: ${warning.message}`);
      process.on('warning', onWarning);
      try {
        await mailroom.enqueueMany(job, Array.from({ length: 90 }, (_, n) => ({ n })));
        let open = 0;
        let most = 0;
        const worker = mailroom.worker({
          queues: [job.queue],
          concurrency: 30,
          handlers: {
            [job.name]: async (_job: Job<{ n: number }>, ctx: JobContext) => {
              await ctx.tx.query('SELECT 1');
              most = Math.max(most, ++open);
              await sleep(40);
              open--;
            },
          },
        });
        const done = waitForEvents(worker, 'completed', 90);
        await worker.start();
        await done;
        await worker.stop();
        await sleep(50); // warnings are emitted on the next tick
        assert.ok(most > 10, `more than ten handler transactions were open at once (${most})`);
        assert.deepEqual(warnings.filter((w) => w.startsWith('MaxListenersExceededWarning')), []);
      } finally {
        process.off('warning', onWarning);
      }
    });
  });
}
