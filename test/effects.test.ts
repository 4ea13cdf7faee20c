/**
 * Exactly-once effects: ctx.tx commits the handler's writes with the fenced
 * completion; ctx.step stores a side effect's result; idempotency keys are stable.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { defineJob, type Job, type JobContext } from '../src/index.ts';
import { testDatabases } from './helpers/databases.ts';
import { eventually, freezeHeartbeats, waitForEvents } from './helpers/events.ts';

const quick = { maxAttempts: 5, backoff: { base: 5, max: 10 } } as const;

for (const db of testDatabases()) {
  describe(`exactly-once effects on ${db.name}`, () => {
    it('ctx.tx: balances equal the number of distinct jobs, with duplicate enqueues and failures after the write', async () => {
      const { mailroom, schema, sql } = await db.open();
      await sql(`CREATE TABLE "${schema}".accounts (id text PRIMARY KEY, balance int NOT NULL DEFAULT 0)`);
      await sql(`INSERT INTO "${schema}".accounts (id) VALUES ('a'), ('b')`);
      const credit = defineJob<{ account: string; n: number }>('effects.credit', { queue: 'credit', retry: quick });
      // 30 distinct jobs, each enqueued twice with the same key: 15 for a, 15 for b.
      for (let round = 0; round < 2; round++) {
        await mailroom.enqueueMany(credit, Array.from({ length: 30 }, (_, n) => ({ account: n % 2 ? 'a' : 'b', n })), { key: (d) => `credit:${d.n}` });
      }
      const attempts = new Map<number, number>();
      const worker = mailroom.worker({
        queues: ['credit'],
        concurrency: 4,
        pollInterval: 20,
        handlers: {
          [credit.name]: async (job: Job<{ account: string; n: number }>, ctx: JobContext) => {
            await ctx.tx.query(`UPDATE "${schema}".accounts SET balance = balance + 1 WHERE id = $1`, [job.data.account]);
            const n = (attempts.get(job.data.n) ?? 0) + 1;
            attempts.set(job.data.n, n);
            if (job.data.n % 3 === 0 && n === 1) throw new Error('failed after writing: the write must roll back');
          },
        },
      });
      const done = waitForEvents(worker, 'completed', 30);
      await worker.start();
      await done;
      await worker.stop();
      const rows = await sql<{ id: string; balance: number }>(`SELECT id, balance FROM "${schema}".accounts ORDER BY id`);
      assert.deepEqual(rows, [{ id: 'a', balance: 15 }, { id: 'b', balance: 15 }]);
      assert.equal([...attempts.values()].filter((n) => n === 2).length, 10, 'every third job ran twice');
    });

    it('ctx.tx: a stale attempt\'s writes roll back when its fenced completion is refused', async () => {
      const { mailroom, schema, sql } = await db.open();
      await sql(`CREATE TABLE "${schema}".counter (n int NOT NULL)`);
      await sql(`INSERT INTO "${schema}".counter VALUES (0)`);
      const job = defineJob('effects.fence', { queue: 'fence', retry: quick });
      const id = await mailroom.enqueue(job, {});
      let release!: () => void;
      const gate = new Promise<void>((r) => (release = r));
      const bump = (ctx: JobContext) => ctx.tx.query(`UPDATE "${schema}".counter SET n = n + 1`);
      const stale = mailroom.worker({ queues: ['fence'], lease: 200, maintenance: false, handlers: { [job.name]: async (_j: Job, ctx: JobContext) => { await gate; await bump(ctx); } } });
      await stale.start();
      await eventually(() => stale.activeCount === 1);
      freezeHeartbeats(stale); // no more heartbeats, as if paused
      await eventually(async () => (await mailroom.maintain()).rescued === 1, 10_000, 'rescue');
      const fresh = mailroom.worker({ queues: ['fence'], maintenance: false, pollInterval: 20, handlers: { [job.name]: (_j: Job, ctx: JobContext) => bump(ctx) } });
      const freshDone = waitForEvents(fresh, 'completed', 1);
      await fresh.start();
      await freshDone;
      const staleResult = waitForEvents(stale, 'stale', 1);
      release();
      await staleResult;
      assert.deepEqual(await sql(`SELECT n FROM "${schema}".counter`), [{ n: 1 }]);
      const info = await mailroom.jobs.get(id);
      assert.equal(info?.state, 'completed');
      assert.equal(info?.lockedBy, fresh.id);
      await fresh.stop();
      await stale.stop({ timeout: 10 });
    });

    it('ctx.tx: a job enqueued with { tx: ctx.tx } exists only if the handler commits', async () => {
      const { mailroom } = await db.open();
      const parent = defineJob<{ fail: boolean }>('effects.parent', { queue: 'parent', retry: { maxAttempts: 1 } });
      const child = defineJob<{ from: boolean }>('effects.child', { queue: 'child' });
      const ids: Record<string, string> = {};
      const worker = mailroom.worker({
        queues: ['parent'],
        handlers: {
          [parent.name]: async (job: Job<{ fail: boolean }>, ctx: JobContext) => {
            ids[String(job.data.fail)] = await mailroom.enqueue(child, { from: job.data.fail }, { tx: ctx.tx });
            if (job.data.fail) throw new Error('parent failed');
          },
        },
      });
      await mailroom.enqueue(parent, { fail: false });
      await mailroom.enqueue(parent, { fail: true });
      const completed = waitForEvents(worker, 'completed', 1);
      const failed = waitForEvents(worker, 'failed', 1);
      await worker.start();
      await Promise.all([completed, failed]);
      await worker.stop();
      assert.equal((await mailroom.jobs.get(ids.false!))?.state, 'available');
      assert.equal(await mailroom.jobs.get(ids.true!), undefined);
    });

    it('ctx.tx carries the lease as the server-side idle timeout of its transaction (PostgreSQL), set with BEGIN', { skip: db.name === 'pglite' ? 'PGlite has no idle_in_transaction_session_timeout' : false }, async () => {
      const { mailroom } = await db.open();
      const job = defineJob('fx.idle-timeout', { queue: 'fx-idle' });
      const seen: string[] = [];
      const worker = mailroom.worker({
        queues: ['fx-idle'],
        lease: '7s',
        handlers: {
          [job.name]: async (_job: Job, ctx: JobContext) => {
            const { rows } = await ctx.tx.query<{ idle_in_transaction_session_timeout: string }>('SHOW idle_in_transaction_session_timeout');
            seen.push(rows[0]!.idle_in_transaction_session_timeout);
          },
        },
      });
      const done = waitForEvents(worker, 'completed', 1);
      await mailroom.enqueue(job, {});
      await worker.start();
      await done;
      await worker.stop();
      assert.deepEqual(seen, ['7s'], 'a paused worker cannot hold its transaction (and its row locks) past the lease');
    });

    it('a ctx.tx commit refused as a serialization failure is a failed attempt retried at once, not a job left to its lease', { skip: db.name === 'pglite' ? 'one connection: no two transactions at once' : false }, async () => {
      const { mailroom, schema, sql } = await db.open();
      await sql(`CREATE TABLE "${schema}".skew (k int NOT NULL)`);
      const job = defineJob('fx.skew', { queue: 'fx-skew', retry: { maxAttempts: 3 } });
      const worker = mailroom.worker({
        queues: ['fx-skew'],
        lease: '60s',
        pollInterval: 20,
        handlers: {
          [job.name]: async (j: Job, ctx: JobContext) => {
            await ctx.tx.query('SET TRANSACTION ISOLATION LEVEL SERIALIZABLE');
            await ctx.tx.query(`SELECT count(*) FROM "${schema}".skew WHERE k = 1`);
            await ctx.tx.query(`INSERT INTO "${schema}".skew (k) VALUES (2)`);
            if (j.attempt === 1) {
              // Write skew: another serializable transaction reads what this one wrote and writes what it read, and commits first.
              await sql(`BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT count(*) FROM "${schema}".skew WHERE k = 2; INSERT INTO "${schema}".skew (k) VALUES (1); COMMIT`);
            }
          },
        },
      });
      const failed = waitForEvents(worker, 'failed', 1, 15_000);
      const done = waitForEvents(worker, 'completed', 1, 15_000); // well before the 60 s lease would have let it run again
      const id = await mailroom.enqueue(job, {});
      await worker.start();
      const [, failure] = (await failed)[0]!;
      await done;
      await worker.stop();
      assert.equal(failure.category, 'transient');
      assert.match(failure.message, /collided with another and was rolled back .*serializ/);
      const status = await mailroom.jobs.get(id);
      assert.equal(status?.state, 'completed');
      assert.equal(status?.attempts, 2);
      const rows = await sql<{ k: number }>(`SELECT k FROM "${schema}".skew ORDER BY k`);
      assert.deepEqual(rows.map((r) => r.k), [1, 2], "the other transaction's row and the second attempt's, not the first attempt's");
    });

    it('ctx.tx used after the handler returned is a clear error, and the job still completes', async () => {
      const { mailroom } = await db.open();
      const job = defineJob('effects.late', { queue: 'late' });
      // The late query's outcome is caught where it is made: under load, 'completed' can arrive after the
      // 20 ms timer, and a rejection with no handler attached yet fails the run as unhandled.
      let late: Promise<unknown> | undefined;
      const worker = mailroom.worker({
        queues: ['late'],
        handlers: {
          [job.name]: async (_j: Job, ctx: JobContext) => {
            await ctx.tx.query('SELECT 1');
            late = new Promise((r) => setTimeout(r, 20))
              .then(() => ctx.tx.query('SELECT 2'))
              .then(() => new Error('the late ctx.tx query succeeded'), (error: unknown) => error);
          },
        },
      });
      await mailroom.enqueue(job, {});
      const done = waitForEvents(worker, 'completed', 1);
      await worker.start();
      await done;
      const lateError = await late;
      assert.ok(lateError instanceof Error);
      assert.match(lateError.message, /ctx\.tx of job effects\.late .* was used after its handler returned/);
      await worker.stop();
    });

    it('ctx.step runs a side effect once across retries; idempotency keys are stable per job and name', async () => {
      const { mailroom } = await db.open();
      const job = defineJob('effects.step', { queue: 'step', retry: quick });
      const id = await mailroom.enqueue(job, {});
      const other = await mailroom.enqueue(job, {});
      let charges = 0;
      let badName: unknown;
      const keys = new Map<string, string[]>();
      const results: unknown[] = [];
      const worker = mailroom.worker({
        queues: ['step'],
        concurrency: 1,
        pollInterval: 20,
        handlers: {
          [job.name]: async (j: Job, ctx: JobContext) => {
            keys.set(j.id, [...(keys.get(j.id) ?? []), ctx.idempotencyKey('charge')]);
            if (j.id === other) badName = await ctx.step('bad name!', () => 1).catch((e: unknown) => e);
            const receipt = await ctx.step('charge', () => ({ receipt: `r-${++charges}`, at: j.attempt }));
            if (j.id === id) results.push(receipt);
            if (j.id === id && j.attempt < 3) throw new Error('email provider down');
          },
        },
      });
      const done = waitForEvents(worker, 'completed', 2);
      await worker.start();
      await done;
      await worker.stop();
      assert.equal(charges, 2, 'one charge per job, not per attempt');
      assert.equal(results.length, 3);
      assert.deepEqual(results[0], { receipt: (results[0] as { receipt: string }).receipt, at: 1 });
      assert.deepEqual(results[1], results[0], 'the retry got the stored result');
      assert.deepEqual(results[2], results[0]);
      const mine = keys.get(id)!;
      assert.equal(mine.length, 3);
      assert.ok(mine.every((k) => k === `mailroom:step:${id}:charge`));
      assert.notEqual(keys.get(other)![0], mine[0]);
      assert.match(String(badName), /ctx\.step\/idempotencyKey: name "bad name!" is not valid/);
    });
  });
}
