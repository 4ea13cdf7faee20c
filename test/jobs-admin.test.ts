/**
 * Job status and operations: cancel, retry, stats, retention, monotonic versions.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createMailroom, defineJob, ValidationError, type Job, type JobContext } from '../src/index.ts';
import { testDatabases } from './helpers/databases.ts';
import { waitForEvents } from './helpers/events.ts';

for (const db of testDatabases()) {
  describe(`job operations on ${db.name}`, () => {
    it('cancels waiting and dead jobs but not active ones; retry gives a dead job a fresh budget', async () => {
      const { mailroom } = await db.open();
      const job = defineJob<{ mode: string }>('admin.cancel', { queue: 'admin', retry: { maxAttempts: 1 } });
      const waiting = await mailroom.enqueue(job, { mode: 'wait' }, { delay: '1h' });
      assert.deepEqual(await mailroom.jobs.cancel(waiting), { changed: true, state: 'cancelled' });
      assert.equal((await mailroom.jobs.get(waiting))?.status, 'cancelled');
      assert.deepEqual(await mailroom.jobs.cancel('not-a-uuid'), { changed: false, state: undefined });
      const poisoned = await mailroom.enqueue(job, { mode: 'fail' });
      let fixed = false;
      let release!: () => void;
      const gate = new Promise<void>((r) => (release = r));
      const worker = mailroom.worker({
        queues: ['admin'],
        pollInterval: 10,
        handlers: {
          [job.name]: async (j: Job<{ mode: string }>) => {
            if (j.data.mode === 'hang') return gate;
            if (!fixed) throw new Error('bug in the handler');
          },
        },
      });
      const failed = waitForEvents(worker, 'failed', 1);
      await worker.start();
      await failed;
      assert.equal((await mailroom.jobs.get(poisoned))?.state, 'dead');
      const active = await mailroom.enqueue(job, { mode: 'hang' });
      await new Promise<void>((resolve) => {
        const t = setInterval(async () => { if ((await mailroom.jobs.get(active))?.state === 'active') { clearInterval(t); resolve(); } }, 10);
      });
      assert.deepEqual(await mailroom.jobs.cancel(active), { changed: false, state: 'active' });
      release();
      fixed = true;
      const completed = waitForEvents(worker, 'completed', 2);
      assert.deepEqual(await mailroom.jobs.retry(poisoned), { changed: true, state: 'available' });
      await completed;
      await worker.stop();
      const info = await mailroom.jobs.get(poisoned);
      assert.equal(info?.state, 'completed');
      assert.equal(info?.attempts, 2);
      assert.equal(info?.maxAttempts, 2, 'one fresh attempt on top of the one spent');
      assert.deepEqual(info?.errors.map((e) => e.message), ['bug in the handler']);
    });

    it('stats: counts by state, oldest age, and per-second rates over the last minute', async () => {
      const { mailroom } = await db.open();
      const job = defineJob('admin.stats', { queue: 'stats', retry: { maxAttempts: 1 } });
      await mailroom.enqueueMany(job, [{ ok: true }, { ok: true }, { ok: false }]);
      await mailroom.enqueue(job, { ok: true }, { delay: '1h' });
      await mailroom.enqueue(job, { ok: true }, { orderingKey: 'k' });
      await mailroom.enqueue(job, { ok: true }, { orderingKey: 'k', delay: '1h' });
      const before = await mailroom.stats();
      assert.equal(before.queues.stats?.available, 4);
      assert.equal(before.queues.stats?.scheduled, 1);
      assert.equal(before.queues.stats?.blocked, 1);
      assert.ok((before.queues.stats?.oldestAgeSeconds ?? -1) >= 0);
      const worker = mailroom.worker({ queues: ['stats'], handlers: { [job.name]: (j: Job<{ ok: boolean }>) => { if (!j.data.ok) throw new Error('no'); } } });
      const done = waitForEvents(worker, 'completed', 3);
      const failed = waitForEvents(worker, 'failed', 1);
      await worker.start();
      await Promise.all([done, failed]);
      await worker.stop();
      const after = await mailroom.stats();
      assert.deepEqual(after.queues.stats, {
        available: 0,
        scheduled: 2, // the delayed one, and the ordered one its key let go of
        retrying: 0,
        blocked: 0,
        active: 0,
        dead: 1,
        oldestAgeSeconds: 0,
        completedPerSecond: Math.round((3 / 60) * 1000) / 1000,
        failedPerSecond: Math.round((1 / 60) * 1000) / 1000,
      });
    });

    it('retention prunes completed jobs by count and age and dead jobs by age, in batches, errors included', async () => {
      const { mailroom, schema, sql } = await db.open({ retention: { completed: { count: 3 }, batchSize: 2 } });
      const job = defineJob('admin.prune', { queue: 'prune', retry: { maxAttempts: 1 } });
      await mailroom.enqueueMany(job, Array.from({ length: 10 }, (_, n) => ({ n })));
      const worker = mailroom.worker({ queues: ['prune'], concurrency: 1, handlers: { [job.name]: (j: Job<{ n: number }>) => { if (j.data.n === 9) throw new Error('dead'); } } });
      const done = waitForEvents(worker, 'completed', 9);
      const dead = waitForEvents(worker, 'failed', 1);
      await worker.start();
      await Promise.all([done, dead]);
      await worker.stop();
      assert.equal((await mailroom.maintain()).pruned, 6);
      const left = await sql<{ state: string; n: number }>(`SELECT state, count(*)::int AS n FROM "${schema}".jobs GROUP BY state ORDER BY state`);
      assert.deepEqual(left, [{ state: 'completed', n: 3 }, { state: 'dead', n: 1 }]);
      // Age: make everything old, then prune again.
      await sql(`UPDATE "${schema}".jobs SET finished_at = now() - interval '30 days'`);
      assert.equal((await mailroom.maintain()).pruned, 4);
      assert.deepEqual(await sql(`SELECT count(*)::int AS n FROM "${schema}".job_errors`), [{ n: 0 }]);
    });

    it('refuses a dead-letter retention shorter than a job type\'s retry horizon, and bad retention options', async () => {
      defineJob('admin.long-retries', { queue: 'x', retry: { maxAttempts: 10, maxAge: '30d' } });
      await assert.rejects(
        createMailroom({ database: await db.handle(), schema: 'never_used', retention: { dead: { age: '14d' } } }),
        (e: unknown) => e instanceof ValidationError && /retention\.dead\.age .* shorter than the retry horizon of job admin\.long-retries/.test(e.message),
      );
      defineJob('admin.long-retries', { queue: 'x', retry: { maxAttempts: 10, maxAge: '1d' } });
      await assert.rejects(createMailroom({ database: await db.handle(), retention: { completed: { count: -1 } } }), /retention\.completed\.count/);
      await assert.rejects(createMailroom({ database: await db.handle(), retention: { batchSize: 0 } }), /retention\.batchSize/);
    });

    it('retention.dedupKeys: a completed job\'s key keeps deduplicating within the window', async () => {
      const { mailroom } = await db.open({ retention: { dedupKeys: '2d' } });
      const job = defineJob('admin.dedup-window', { queue: 'dedup-window', retry: { maxAttempts: 3, maxAge: '1h' } });
      const first = await mailroom.enqueue(job, {}, { key: 'order:7' });
      const worker = mailroom.worker({ queues: ['dedup-window'], handlers: { [job.name]: () => {} } });
      const done = waitForEvents(worker, 'completed', 1);
      await worker.start();
      await done;
      await worker.stop();
      assert.equal(await mailroom.enqueue(job, {}, { key: 'order:7' }), first, 'a redelivery after completion is caught');
      const [again, other] = await mailroom.enqueueMany(job, [{}, {}], { key: (_d, i) => (i === 0 ? 'order:7' : 'order:8') });
      assert.equal(again, first);
      assert.notEqual(other, first);
      await assert.rejects(
        createMailroom({ database: await db.handle(), retention: { dedupKeys: '10d', completed: { age: '1d' } } }),
        /retention\.completed\.age .* shorter than retention\.dedupKeys/,
      );
      defineJob('admin.dedup-long', { queue: 'x', retry: { maxAttempts: 3, maxAge: '3d' } });
      await assert.rejects(
        createMailroom({ database: await db.handle(), retention: { dedupKeys: '2d' } }),
        /retention\.dedupKeys .* shorter than the retry horizon of job admin\.dedup-long/,
      );
      defineJob('admin.dedup-long', { queue: 'x', retry: { maxAttempts: 3, maxAge: '1h' } });
    });

    it('versions: an outdated update is ignored when versions arrive out of order', async () => {
      const { mailroom, schema, sql } = await db.open();
      await sql(`CREATE TABLE "${schema}".customers (id text PRIMARY KEY, email text, version int)`);
      await sql(`INSERT INTO "${schema}".customers VALUES ('c1', 'v0@example.com', 0)`);
      const update = defineJob<{ id: string; email: string; version: number }>('admin.customer', { queue: 'customers' });
      const arrivals = [3, 1, 2, 5, 4, 5];
      for (const v of arrivals) await mailroom.enqueue(update, { id: 'c1', email: `v${v}@example.com`, version: v });
      const applied: number[] = [];
      const worker = mailroom.worker({
        queues: ['customers'],
        concurrency: 1,
        handlers: {
          [update.name]: async (j: Job<{ id: string; email: string; version: number }>, ctx: JobContext) => {
            if (!(await ctx.isNewer(`customer:${j.data.id}`, j.data.version))) return;
            applied.push(j.data.version);
            await ctx.tx.query(`UPDATE "${schema}".customers SET email = $2, version = $3 WHERE id = $1`, [j.data.id, j.data.email, j.data.version]);
          },
        },
      });
      const done = waitForEvents(worker, 'completed', arrivals.length);
      await worker.start();
      await done;
      await worker.stop();
      assert.deepEqual(applied, [3, 5]);
      assert.deepEqual(await sql(`SELECT email, version FROM "${schema}".customers`), [{ email: 'v5@example.com', version: 5 }]);
      assert.equal(await mailroom.versions.advance('customer:c1', 4), false);
      assert.equal(await mailroom.versions.advance('customer:c1', 6), true);
      await assert.rejects(mailroom.versions.advance('customer:c1', 1.5), /must be an integer/);
    });

    it('a retried dead job with an ordering key queues behind the key again', async () => {
      const { mailroom } = await db.open();
      const job = defineJob<{ n: number }>('admin.ordered', { queue: 'ordered', retry: { maxAttempts: 1 } });
      const first = await mailroom.enqueue(job, { n: 1 }, { orderingKey: 'acct' });
      let failFirst = true;
      const order: number[] = [];
      const worker = mailroom.worker({
        queues: ['ordered'],
        pollInterval: 10,
        handlers: {
          [job.name]: (j: Job<{ n: number }>) => {
            if (j.data.n === 1 && failFirst) throw new Error('poison');
            order.push(j.data.n);
          },
        },
      });
      const failed = waitForEvents(worker, 'failed', 1);
      await worker.start();
      await failed;
      failFirst = false;
      // While n=2 holds the key (delayed), retrying n=1 must queue behind it.
      const second = await mailroom.enqueue(job, { n: 2 }, { orderingKey: 'acct', delay: 300 });
      await mailroom.jobs.retry(first);
      assert.match((await mailroom.jobs.get(first))?.status ?? '', /waiting for an earlier job with ordering key acct/);
      const done = waitForEvents(worker, 'completed', 2);
      await done;
      await worker.stop();
      assert.deepEqual(order, [2, 1]);
      assert.equal((await mailroom.jobs.get(second))?.state, 'completed');
    });
  });
}
