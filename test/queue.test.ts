/**
 * The job state machine end to end, on PGlite and (with TEST_DATABASE_URL) PostgreSQL:
 * enqueue, dedup keys, transactional enqueue, completion, retries, dead letters,
 * snooze, fencing of stale attempts, lease rescue and graceful stop.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import type { PGlite } from '@electric-sql/pglite';
import { cancel, createMailroom, defineEvent, defineJob, PermanentError, RateLimitedError, RetryableError, snooze, TransactionEndedError, type Job, type Mailroom, type Worker } from '../src/index.ts';
import { databaseUrl, testDatabases, uniqueSchema } from './helpers/databases.ts';
import { jobQueries } from '../src/jobs/queries.ts';
import { controlQueries } from '../src/jobs/control-queries.ts';
import { eventually, freezeHeartbeats, waitForEvents } from './helpers/events.ts';
import { explainPrepared, itPlans, PLAN_MODES } from './helpers/plans.ts';
import { beforeEachStatement } from './helpers/pool-statements.ts';

const quick = { maxAttempts: 3, backoff: { base: 5, max: 10 } } as const;

for (const db of testDatabases()) {
  describe(`job queue on ${db.name}`, () => {
    it('runs every enqueued job once and marks it completed', async () => {
      const { mailroom } = await db.open();
      const job = defineJob<{ n: number }>('queue.basic', { queue: 'basic' });
      const ids = await mailroom.enqueueMany(job, Array.from({ length: 200 }, (_, n) => ({ n })));
      const seen: number[] = [];
      const worker = mailroom.worker({ queues: ['basic'], concurrency: 8, handlers: { [job.name]: (j: Job<{ n: number }>) => void seen.push(j.data.n) } });
      const done = waitForEvents(worker, 'completed', 200);
      await worker.start();
      await done;
      await worker.stop();
      assert.deepEqual([...seen].sort((a, b) => a - b), Array.from({ length: 200 }, (_, n) => n));
      const info = await mailroom.jobs.get(ids[0]!);
      assert.equal(info?.state, 'completed');
      assert.equal(info?.status, 'completed');
      assert.equal(info?.attempts, 1);
      assert.deepEqual(info?.history.map((h) => h.event), ['enqueued', 'started', 'completed']);
      assert.equal(info?.history[1]?.worker, worker.id);
    });

    it('deduplicates by key while the first job is unfinished, and accepts the key again after', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob<{ v: number }>('queue.dedup', { queue: 'dedup' });
      const first = await mailroom.enqueue(job, { v: 1 }, { key: 'user:1' });
      const second = await mailroom.enqueue(job, { v: 2 }, { key: 'user:1' });
      const many = await mailroom.enqueueMany(job, [{ v: 3 }, { v: 4 }, { v: 5 }], { key: (d) => (d.v === 4 ? 'user:2' : 'user:1') });
      assert.equal(second, first);
      assert.equal(many[0], first);
      assert.equal(many[2], first);
      assert.notEqual(many[1], first);
      const count = await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs`);
      assert.equal(count[0]!.n, 2);
      const worker = mailroom.worker({ queues: ['dedup'], handlers: { [job.name]: () => {} } });
      const done = waitForEvents(worker, 'completed', 2);
      await worker.start();
      await done;
      await worker.stop();
      const third = await mailroom.enqueue(job, { v: 6 }, { key: 'user:1' });
      assert.notEqual(third, first, 'a finished job no longer holds its key');
    });

    it('a job enqueued in a transaction exists if and only if the transaction commits', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob('queue.tx', { queue: 'tx' });
      await sql(`CREATE TABLE "${schema}".orders (id int primary key)`);
      const committed = await mailroom.transaction(async (tx) => {
        await tx.query(`INSERT INTO "${schema}".orders VALUES (1)`);
        return mailroom.enqueue(job, { order: 1 }, { tx });
      });
      let rolledBack: string | undefined;
      await assert.rejects(
        mailroom.transaction(async (tx) => {
          await tx.query(`INSERT INTO "${schema}".orders VALUES (2)`);
          rolledBack = await mailroom.enqueue(job, { order: 2 }, { tx });
          throw new Error('business rule failed');
        }),
        /business rule failed/,
      );
      // The driver's own transaction handle works too.
      const handle = await db.handle();
      let viaDriver: string;
      let viaDriverRolledBack: string | undefined;
      if (db.name === 'postgres') {
        const client = await (handle as pg.Pool).connect();
        try {
          await client.query('BEGIN');
          viaDriver = await mailroom.enqueue(job, { order: 3 }, { tx: client });
          await client.query('COMMIT');
          await client.query('BEGIN');
          viaDriverRolledBack = await mailroom.enqueue(job, { order: 4 }, { tx: client });
          await client.query('ROLLBACK');
        } finally {
          client.release();
        }
      } else {
        viaDriver = await (handle as PGlite).transaction((tx) => mailroom.enqueue(job, { order: 3 }, { tx }));
        await (handle as PGlite)
          .transaction(async (tx) => {
            viaDriverRolledBack = await mailroom.enqueue(job, { order: 4 }, { tx });
            await tx.rollback();
          })
          .catch(() => {});
      }
      assert.ok(rolledBack && viaDriverRolledBack);
      assert.equal((await mailroom.jobs.get(committed))?.state, 'available');
      assert.equal((await mailroom.jobs.get(viaDriver))?.state, 'available');
      assert.equal(await mailroom.jobs.get(rolledBack), undefined);
      assert.equal(await mailroom.jobs.get(viaDriverRolledBack), undefined);
      const ran: unknown[] = [];
      const worker = mailroom.worker({ queues: ['tx'], handlers: { [job.name]: (j: Job) => void ran.push(j.data) } });
      const done = waitForEvents(worker, 'completed', 2);
      await worker.start();
      await done;
      await worker.stop();
      assert.deepEqual(ran.map((d) => (d as { order: number }).order).sort(), [1, 3]);
    });

    it('a tx whose transaction already ended is refused with TransactionEndedError, and no job is written (keys and ordering keys too)', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob<{ n: number }>('queue.tx-ended', { queue: 'tx-ended' });
      const refused = (e: unknown) =>
        e instanceof TransactionEndedError && /^enqueue job queue\.tx-ended: tx is not inside a transaction \(its transaction already committed or rolled back\); nothing was written/.test(e.message);
      let leaked: Parameters<Parameters<typeof mailroom.transaction>[0]>[0] | undefined;
      await mailroom.transaction(async (tx) => {
        leaked = tx;
      });
      await assert.rejects(mailroom.enqueue(job, { n: 1 }, { tx: leaked! }), TransactionEndedError);
      const handle = await db.handle();
      if (db.name === 'postgres') {
        const client = await (handle as pg.Pool).connect();
        try {
          await client.query('BEGIN');
          await client.query('COMMIT');
          // After COMMIT the client is in autocommit: each statement would commit on its own.
          await assert.rejects(mailroom.enqueue(job, { n: 2 }, { tx: client }), refused);
          await assert.rejects(mailroom.enqueueMany(job, [{ n: 3 }, { n: 4 }], { tx: client, key: (d) => `k${d.n}`, orderingKey: 'o' }), refused);
          await assert.rejects(mailroom.enqueue(job, { n: 5 }, { tx: handle as pg.Pool }), refused);
          // The same client in a new transaction works again.
          await client.query('BEGIN');
          await mailroom.enqueue(job, { n: 6 }, { tx: client });
          await client.query('COMMIT');
        } finally {
          client.release();
        }
      } else {
        let ended: Parameters<Parameters<PGlite['transaction']>[0]>[0] | undefined;
        await (handle as PGlite).transaction(async (tx) => {
          ended = tx;
        });
        await assert.rejects(mailroom.enqueue(job, { n: 2 }, { tx: ended! }), refused);
        await assert.rejects(mailroom.enqueue(job, { n: 5 }, { tx: handle as PGlite }), refused);
        await mailroom.enqueue(job, { n: 6 });
      }
      const rows = await sql<{ n: number }>(`SELECT (payload->>'n')::int AS n FROM "${schema}".jobs ORDER BY n`);
      assert.deepEqual(rows.map((r) => r.n), [6], 'only the job enqueued inside a transaction (or on the pool)');
    });

    it('on the embedded database, an enqueue inside mailroom.transaction without { tx } waits for the transaction: after a few seconds a process warning says why and what to do', { skip: db.name === 'pglite' ? false : 'PGlite only: a server has connections enough' }, async () => {
      const { mailroom } = await db.open();
      const job = defineJob('queue.pglite-wait', { queue: 'pglite-wait' });
      const warned = new Promise<Error>((resolve) => {
        const on = (warning: Error & { code?: string }) => {
          if (warning.code !== 'MAILROOM_PGLITE_WAIT') return;
          process.off('warning', on);
          resolve(warning);
        };
        process.on('warning', on);
      });
      let stuck: Promise<string> | undefined;
      await mailroom.transaction(async () => {
        stuck = mailroom.enqueue(job, {}); // awaited here, it would wait for good
        const warning = await warned;
        assert.match(warning.message, /behind an open transaction\. If it was issued inside mailroom\.transaction\(fn\) without \{ tx \}.*pass \{ tx \} to everything inside the transaction/);
      });
      assert.ok(await stuck, 'once the transaction ended, the enqueue ran');
    });

    it('retries transient failures with backoff, then dead-letters with every attempt recorded', async () => {
      const { mailroom } = await db.open();
      const job = defineJob('queue.flaky', { queue: 'flaky', retry: quick });
      const recovers = await mailroom.enqueue(job, { failTimes: 2 }, { correlationId: 'req-42' });
      const exhausts = await mailroom.enqueue(job, { failTimes: 99 });
      const counts = new Map<string, number>();
      const worker = mailroom.worker({
        queues: ['flaky'],
        pollInterval: 20,
        handlers: {
          [job.name]: (j: Job<{ failTimes: number }>) => {
            const n = (counts.get(j.id) ?? 0) + 1;
            counts.set(j.id, n);
            if (n <= j.data.failTimes) throw Object.assign(new Error(`boom ${n}`), { code: 'ECONNRESET' });
          },
        },
      });
      const dead = waitForEvents(worker, 'failed', 5);
      const completed = waitForEvents(worker, 'completed', 1);
      await worker.start();
      await Promise.all([dead, completed]);
      await worker.stop();
      const ok = await mailroom.jobs.get(recovers);
      assert.equal(ok?.state, 'completed');
      assert.equal(ok?.attempts, 3);
      assert.equal(ok?.correlationId, 'req-42');
      assert.deepEqual(ok?.errors.map((e) => [e.attempt, e.category]), [[1, 'transient'], [2, 'transient']]);
      const bad = await mailroom.jobs.get(exhausts);
      assert.equal(bad?.state, 'dead');
      assert.equal(bad?.status, 'sent to support');
      assert.equal(bad?.deadReason, 'max-attempts');
      assert.equal(bad?.attempts, 3);
      assert.deepEqual(bad?.data, { failTimes: 99 });
      assert.deepEqual(bad?.errors.map((e) => e.message), ['boom 1', 'boom 2', 'boom 3']);
      assert.ok(bad?.errors.every((e) => e.worker === worker.id && e.startedAt instanceof Date));
      assert.deepEqual(bad?.history.map((h) => h.event), ['enqueued', 'started', 'failed', 'started', 'failed', 'started', 'failed', 'dead-lettered']);
      assert.ok(bad?.errors.every((e) => e.stack?.includes('boom')));
      assert.ok(bad?.finishedAt && bad.startedAt && bad.createdAt);
    });

    it('dead-letters permanent errors at once, honours RetryableError.after, and snoozes without spending attempts', async () => {
      const { mailroom } = await db.open();
      const job = defineJob('queue.outcomes', { queue: 'outcomes', retry: { maxAttempts: 2, backoff: { base: '1h', max: '1h' } } });
      const permanent = await mailroom.enqueue(job, { kind: 'permanent' });
      const status422 = await mailroom.enqueue(job, { kind: '422' });
      const after = await mailroom.enqueue(job, { kind: 'after' });
      const snoozer = await mailroom.enqueue(job, { kind: 'snooze' });
      let snoozes = 0;
      const worker = mailroom.worker({
        queues: ['outcomes'],
        pollInterval: 20,
        handlers: {
          [job.name]: (j: Job<{ kind: string }>) => {
            if (j.data.kind === 'permanent') throw new PermanentError('card declined');
            if (j.data.kind === '422') throw Object.assign(new Error('unprocessable'), { status: 422 });
            if (j.data.kind === 'after') {
              if (j.attempt === 1) throw new RetryableError('busy', { after: 30 });
              return;
            }
            if (snoozes++ < 3) return snooze(10);
          },
        },
      });
      const completed = waitForEvents(worker, 'completed', 2);
      const failed = waitForEvents(worker, 'failed', 3);
      await worker.start();
      await Promise.all([completed, failed]);
      await worker.stop();
      const p = await mailroom.jobs.get(permanent);
      assert.equal(p?.state, 'dead');
      assert.equal(p?.deadReason, 'permanent');
      assert.equal(p?.attempts, 1);
      assert.equal((await mailroom.jobs.get(status422))?.deadReason, 'permanent');
      const a = await mailroom.jobs.get(after);
      assert.equal(a?.state, 'completed', 'Retry-After of 30ms replaced the 1h backoff');
      assert.equal(a?.attempts, 2);
      const s = await mailroom.jobs.get(snoozer);
      assert.equal(s?.state, 'completed');
      assert.equal(s?.attempts, 1, 'snoozes spend no attempts');
      assert.equal(snoozes, 4);
    });

    it('a Retry-After header as the provider sent it sets the delay; a value it cannot read keeps the backoff and is recorded, the worker going on', async () => {
      const { mailroom } = await db.open();
      const job = defineJob('queue.retry-after', { queue: 'retry-after', retry: { maxAttempts: 3, backoff: { base: '20ms', max: '20ms', jitter: 'none' } } });
      const headers = new Map<string, string>([['absent', ''], ['seconds', '0']]);
      const ids = await Promise.all(['seconds', 'absent', 'garbage', 'limited'].map((kind) => mailroom.enqueue(job, { kind })));
      const worker = mailroom.worker({
        queues: ['retry-after'],
        pollInterval: 10,
        handlers: {
          [job.name]: (j: Job<{ kind: string }>) => {
            if (j.attempt > 1 || (j.data.kind === 'limited' && j.attempt === 1 && headers.has('limited-done'))) return;
            if (j.data.kind === 'limited') {
              headers.set('limited-done', '1');
              throw new RateLimitedError('429', { after: 'Thursday' });
            }
            const after = j.data.kind === 'seconds' ? headers.get('seconds') : j.data.kind === 'absent' ? null : 'soon';
            throw new RetryableError(`${j.data.kind} 503`, { after });
          },
        },
      });
      const completed = waitForEvents(worker, 'completed', 4);
      await worker.start();
      await completed;
      await worker.stop();
      const jobs = await Promise.all(ids.map((id) => mailroom.jobs.get(id)));
      assert.deepEqual(jobs.map((j) => j?.state), ['completed', 'completed', 'completed', 'completed'], 'no job left active by a bad value');
      assert.deepEqual(jobs.slice(0, 3).map((j) => j?.attempts), [2, 2, 2]);
      assert.equal(jobs[0]?.errors[0]?.message, 'seconds 503');
      assert.equal(jobs[1]?.errors[0]?.message, 'absent 503');
      assert.match(jobs[2]?.errors[0]?.message ?? '', /^garbage 503 \(RetryableError\.after: "soon" is neither a duration .*\)$/);
    });

    it('a handler that returns cancel(reason) ends its job as cancelled (no retry, no dead letter), the reason in its history; ctx.tx writes commit with it', async () => {
      const { mailroom, schema, sql } = await db.open();
      await sql(`CREATE TABLE "${schema}".notes (text text)`);
      const job = defineJob<{ kind: string }>('queue.cancel', { queue: 'cancel' });
      const plain = await mailroom.enqueue(job, { kind: 'plain' });
      const inTx = await mailroom.enqueue(job, { kind: 'tx' });
      const bus: string[] = [];
      mailroom.on('job.cancelled', (j) => void bus.push(`${j.id}:${j.reason}`));
      const worker = mailroom.worker({
        queues: ['cancel'],
        pollInterval: 10,
        handlers: {
          [job.name]: async (j: Job<{ kind: string }>, ctx) => {
            if (j.data.kind === 'tx') await ctx.tx.query(`INSERT INTO "${schema}".notes VALUES ('written before the cancel')`);
            return cancel(`order of ${j.data.kind} was refunded`);
          },
        },
      });
      const cancelled = waitForEvents(worker, 'cancelled', 2);
      await worker.start();
      const events = await cancelled;
      await worker.stop();
      assert.deepEqual(events.map(([, reason]) => reason).sort(), ['order of plain was refunded', 'order of tx was refunded']);
      for (const [id, kind] of [[plain, 'plain'], [inTx, 'tx']] as const) {
        const info = await mailroom.jobs.get(id);
        assert.equal(info?.state, 'cancelled');
        assert.equal(info?.status, 'cancelled');
        assert.equal(info?.attempts, 1);
        assert.deepEqual(info?.history.at(-1) && [info.history.at(-1)!.event, info.history.at(-1)!.detail], ['cancelled', `order of ${kind} was refunded`]);
      }
      assert.deepEqual(await sql(`SELECT text FROM "${schema}".notes`), [{ text: 'written before the cancel' }]);
      assert.equal((await mailroom.deadLetters.list({ queue: 'cancel' })).items.length, 0, 'not a dead letter');
      assert.deepEqual(bus.sort(), [`${plain}:order of plain was refunded`, `${inTx}:order of tx was refunded`]);
      assert.throws(() => cancel(''), /reason must be a non-empty string/);
    });

    it('dead-letters a job past maxAge instead of retrying it', async () => {
      const { mailroom } = await db.open();
      const job = defineJob('queue.maxage', { queue: 'maxage', retry: { maxAttempts: 10, maxAge: 1, backoff: { base: '1m', max: '1m' } } });
      const id = await mailroom.enqueue(job, {});
      const worker = mailroom.worker({ queues: ['maxage'], handlers: { [job.name]: () => { throw new Error('down'); } } });
      const failed = waitForEvents(worker, 'failed', 1);
      await worker.start();
      const events = await failed;
      await worker.stop();
      assert.equal(events[0]?.[1].dead, true);
      const info = await mailroom.jobs.get(id);
      assert.equal(info?.state, 'dead');
      assert.equal(info?.deadReason, 'max-age');
    });

    it('a snooze or a rate limit that would take a job past maxAge dead-letters it (no job waits forever), with or without ctx.tx', async () => {
      const { mailroom } = await db.open();
      const job = defineJob<{ kind: string }>('queue.maxage-snooze', { queue: 'maxage-snooze', retry: { maxAge: '1h' } });
      const ids = await Promise.all(['snooze', 'snooze-tx', 'limited', 'short'].map((kind) => mailroom.enqueue(job, { kind })));
      const worker = mailroom.worker({
        queues: ['maxage-snooze'],
        pollInterval: 10,
        handlers: {
          [job.name]: async (j: Job<{ kind: string }>, ctx) => {
            if (j.data.kind === 'snooze') return snooze('2h');
            if (j.data.kind === 'snooze-tx') {
              await ctx.tx.query('SELECT 1');
              return snooze('2h');
            }
            if (j.data.kind === 'limited') throw new RateLimitedError('429 from provider', { after: '3h' });
            return snooze('10m'); // within maxAge: waits as before
          },
        },
      });
      const failed = waitForEvents(worker, 'failed', 3);
      const snoozed = waitForEvents(worker, 'snoozed', 1);
      await worker.start();
      const [events] = await Promise.all([failed, snoozed]);
      await worker.stop();
      assert.ok(events.every(([, f]) => f.dead && !f.willRetry), 'the worker reports each as dead-lettered');
      const [snoozing, inTx, limited, short] = await Promise.all(ids.map((id) => mailroom.jobs.get(id)));
      for (const dead of [snoozing, inTx, limited]) {
        assert.equal(dead?.state, 'dead');
        assert.equal(dead?.deadReason, 'max-age');
      }
      assert.equal(short?.state, 'scheduled', 'a snooze within maxAge waits');
      const letters = await mailroom.deadLetters.list({ queue: 'maxage-snooze' });
      const byId = new Map(letters.items.map((l) => [l.id, l]));
      assert.match(byId.get(ids[0]!)?.message ?? '', /snoozed for 7200000 ms, which would take the job past its maxAge/);
      assert.equal(byId.get(ids[0]!)?.category, 'max-age');
      assert.equal(byId.get(ids[2]!)?.category, 'transient');
      assert.match(byId.get(ids[2]!)?.message ?? '', /^429 from provider; the queue's back-off of 10800000 ms would take the job past its maxAge$/);
    });

    it('times a handler out through its AbortSignal and retries it', async () => {
      const { mailroom } = await db.open();
      const job = defineJob('queue.timeout', { queue: 'timeout', timeout: 50, retry: quick });
      const id = await mailroom.enqueue(job, {});
      let sawAbort = false;
      const worker = mailroom.worker({
        queues: ['timeout'],
        pollInterval: 20,
        handlers: {
          [job.name]: (j: Job, ctx) =>
            j.attempt === 1
              ? new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => { sawAbort = true; resolve(); }))
              : undefined,
        },
      });
      const completed = waitForEvents(worker, 'completed', 1);
      await worker.start();
      await completed;
      await worker.stop();
      assert.ok(sawAbort);
      const info = await mailroom.jobs.get(id);
      assert.equal(info?.attempts, 2);
      assert.equal(info?.errors[0]?.category, 'timeout');
    });

    /** Freezes `stale`'s heartbeats (as SIGSTOP would), waits until its job's lease ran out, and rescues it. */
    const rescueFrom = async (stale: Worker, opened: Awaited<ReturnType<typeof db.open>>): Promise<void> => {
      freezeHeartbeats(stale);
      await eventually(async () => (await opened.sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${opened.schema}".jobs WHERE locked_until < now()`))[0]!.n === 1);
      assert.equal((await opened.mailroom.maintain()).rescued, 1);
    };
    /** The job was completed by its second attempt, on `fresh`. */
    const completedBy = async (mailroom: Mailroom, id: string, fresh: Worker): Promise<void> => {
      const info = await mailroom.jobs.get(id);
      assert.equal(info?.state, 'completed');
      assert.equal(info?.attempts, 2);
      assert.equal(info?.lockedBy, fresh.id);
      assert.deepEqual(info?.errors.map((e) => e.category), ['lease-expired']);
    };

    it('fences a stale attempt: after its lease is rescued and re-claimed, the old worker cannot complete or fail it', async () => {
      const opened = await db.open();
      const { mailroom } = opened;
      const job = defineJob('queue.fence', { queue: 'fence', retry: quick });
      const id = await mailroom.enqueue(job, {});
      let release!: () => void;
      const gate = new Promise<void>((r) => (release = r));
      const stale = mailroom.worker({ queues: ['fence'], lease: 200, maintenance: false, handlers: { [job.name]: () => gate } });
      // The stale worker's heartbeat is what would keep its lease: freeze it by stopping its timers (as SIGSTOP would).
      const started = new Promise<void>((resolve) => {
        const check = setInterval(() => { if (stale.activeCount > 0) { clearInterval(check); resolve(); } }, 5);
      });
      await stale.start();
      await started;
      await rescueFrom(stale, opened);
      const fresh = mailroom.worker({ queues: ['fence'], maintenance: false, pollInterval: 20, handlers: { [job.name]: () => {} } });
      const freshDone = waitForEvents(fresh, 'completed', 1);
      await fresh.start();
      await freshDone;
      const staleResult = waitForEvents(stale, 'stale', 1);
      release();
      await staleResult;
      await completedBy(mailroom, id, fresh);
      await fresh.stop();
      await stale.stop({ timeout: 10 });
    });

    for (const through of ['the worker\'s completion', 'ctx.tx'] as const) {
      it(`fences a stale attempt while the next one runs: its completion through ${through} is refused, and the newer attempt completes the job`, async () => {
        const opened = await db.open();
        const { mailroom } = opened;
        const job = defineJob('queue.fence-running', { queue: 'fence-running', retry: quick });
        const id = await mailroom.enqueue(job, {});
        let releaseStale!: () => void;
        const staleGate = new Promise<void>((r) => (releaseStale = r));
        let releaseFresh!: () => void;
        const freshGate = new Promise<void>((r) => (releaseFresh = r));
        const stale = mailroom.worker({
          queues: ['fence-running'], lease: 200, maintenance: false,
          handlers: { [job.name]: async (_j, ctx) => { await staleGate; if (through === 'ctx.tx') await ctx.tx.query('SELECT 1'); } },
        });
        await stale.start();
        await eventually(() => stale.activeCount === 1);
        await rescueFrom(stale, opened);
        const fresh = mailroom.worker({ queues: ['fence-running'], maintenance: false, pollInterval: 20, handlers: { [job.name]: () => freshGate } });
        await fresh.start();
        await eventually(() => fresh.activeCount === 1);
        // The stale attempt finishes while the newer one is still running: the job is active, under claim 2.
        const staleResult = waitForEvents(stale, 'stale', 1);
        releaseStale();
        await staleResult;
        const during = await mailroom.jobs.get(id);
        assert.equal(during?.state, 'active', 'the stale completion was refused: the newer attempt still holds the job');
        assert.equal(during?.lockedBy, fresh.id);
        const freshDone = waitForEvents(fresh, 'completed', 1);
        releaseFresh();
        await freshDone;
        await completedBy(mailroom, id, fresh);
        await fresh.stop();
        await stale.stop({ timeout: 10 });
      });
    }

    it('rescues a crashed worker\'s jobs and dead-letters a job that keeps crashing its worker', async () => {
      const { mailroom } = await db.open();
      const job = defineJob('queue.crash', { queue: 'crash', retry: { maxAttempts: 2 } });
      const id = await mailroom.enqueue(job, {});
      for (let i = 0; i < 2; i++) {
        const w = mailroom.worker({ queues: ['crash'], lease: 100, maintenance: false, handlers: { [job.name]: () => new Promise(() => {}) } });
        await w.start();
        await eventually(() => w.activeCount === 1);
        w.abandon();
        await eventually(async () => (await mailroom.maintain()).rescued === 1, 10_000, 'rescue');
      }
      const info = await mailroom.jobs.get(id);
      assert.equal(info?.state, 'dead');
      assert.equal(info?.deadReason, 'max-attempts');
      assert.deepEqual(info?.errors.map((e) => [e.attempt, e.category]), [[1, 'lease-expired'], [2, 'lease-expired']]);
    });

    it('graceful stop waits for handlers, then hands unfinished jobs back without spending an attempt', async () => {
      const { mailroom } = await db.open();
      const job = defineJob<{ slow: boolean }>('queue.stop', { queue: 'stop' });
      const quickId = await mailroom.enqueue(job, { slow: false });
      const slowId = await mailroom.enqueue(job, { slow: true });
      let aborted = false;
      const worker = mailroom.worker({
        queues: ['stop'],
        concurrency: 2,
        handlers: {
          [job.name]: (j: Job<{ slow: boolean }>, ctx) =>
            new Promise<void>((resolve) => {
              if (!j.data.slow) return void setTimeout(resolve, 30);
              ctx.signal.addEventListener('abort', () => { aborted = true; resolve(); });
            }),
        },
      });
      await worker.start();
      await eventually(() => worker.activeCount === 2);
      await worker.stop({ timeout: 300 });
      assert.ok(aborted, 'the slow handler saw its signal abort');
      assert.equal((await mailroom.jobs.get(quickId))?.state, 'completed');
      const slow = await mailroom.jobs.get(slowId);
      assert.equal(slow?.state, 'available');
      assert.equal(slow?.attempts, 0);
      assert.equal(slow?.errors.length, 0);
    });

    it('close({ timeout }) stops relays, consumer groups and workers together: handlers that ignore their signal hold it one timeout, not one per kind', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob('queue.close-stuck', { queue: 'close-stuck' });
      const event = defineEvent('queue.close-stuck.noted', { version: 1 });
      const never = () => new Promise<void>(() => {});
      const worker = mailroom.worker({ queues: ['close-stuck'], handlers: { [job.name]: never } });
      const consumer = mailroom.consumer({ group: 'close-stuck', handlers: { [event.type]: never } });
      const relay = mailroom.relay({ pollInterval: 50 });
      await worker.start();
      await consumer.start();
      await relay.start();
      const jobId = await mailroom.enqueue(job, {});
      await mailroom.publish(event, {});
      await eventually(() => worker.activeCount === 1 && consumer.worker.activeCount === 1, 10_000, 'both handlers running');
      const began = Date.now();
      await mailroom.close({ timeout: 1500 });
      const took = Date.now() - began;
      assert.ok(took >= 1400, `close() resolved after ${took} ms, before its timeout`);
      assert.ok(took < 2800, `close({ timeout: 1500 }) took ${took} ms: the group's handler and the worker's were waited for one after the other`);
      // Both jobs went back to their queues unspent, as a worker's own stop leaves them.
      const rows = await sql<{ id: string; state: string; attempt: number }>(`SELECT id, state, attempt FROM "${schema}".jobs ORDER BY queue`);
      assert.deepEqual(rows.map((r) => [r.state, r.attempt]), [['available', 0], ['available', 0]]);
      assert.ok(rows.some((r) => r.id === jobId));
    });

    it('runs higher priority first and holds delayed jobs until due', async () => {
      const { mailroom } = await db.open();
      const job = defineJob<{ name: string }>('queue.priority', { queue: 'prio' });
      await mailroom.enqueue(job, { name: 'low' }, { priority: -1 });
      await mailroom.enqueue(job, { name: 'normal' });
      await mailroom.enqueue(job, { name: 'high' }, { priority: 5 });
      const later = await mailroom.enqueue(job, { name: 'later' }, { delay: '1h' });
      const order: string[] = [];
      const worker = mailroom.worker({ queues: ['prio'], concurrency: 1, handlers: { [job.name]: (j: Job<{ name: string }>) => void order.push(j.data.name) } });
      const done = waitForEvents(worker, 'completed', 3);
      await worker.start();
      await done;
      await worker.stop();
      assert.deepEqual(order, ['high', 'normal', 'low']);
      const info = await mailroom.jobs.get(later);
      assert.equal(info?.state, 'scheduled');
      assert.ok(info!.nextRunAt!.getTime() > Date.now() + 50 * 60_000);
    });

    it('prefetch: jobs claimed ahead run once each; a graceful stop hands the held ones back unspent', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob<{ n: number }>('queue.prefetch', { queue: 'prefetch' });
      await mailroom.enqueueMany(job, Array.from({ length: 300 }, (_, n) => ({ n })));
      const seen = new Map<number, number>();
      let running = 0;
      let peak = 0;
      const fast = mailroom.worker({
        queues: ['prefetch'],
        concurrency: 4,
        prefetch: 50,
        handlers: {
          [job.name]: async (j: Job<{ n: number }>) => {
            peak = Math.max(peak, ++running);
            seen.set(j.data.n, (seen.get(j.data.n) ?? 0) + 1);
            await new Promise((r) => setImmediate(r));
            running--;
          },
        },
      });
      const done = waitForEvents(fast, 'completed', 300);
      await fast.start();
      await done;
      await fast.stop();
      assert.equal(seen.size, 300);
      assert.ok([...seen.values()].every((n) => n === 1), 'each job ran once');
      assert.ok(peak <= 4, `concurrency still caps running handlers (peak ${peak})`);
      // A worker holding prefetched jobs stops: they go back to the queue with no attempt spent.
      await mailroom.enqueueMany(job, Array.from({ length: 20 }, (_, n) => ({ n: 1000 + n })));
      let release!: () => void;
      const gate = new Promise<void>((r) => (release = r));
      const holder = mailroom.worker({ queues: ['prefetch'], concurrency: 1, prefetch: 10, handlers: { [job.name]: () => gate } });
      await holder.start();
      await eventually(async () => (await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE state = 'active'`))[0]!.n === 11);
      const stopping = holder.stop({ timeout: 50 });
      release();
      await stopping;
      const rows = await sql<{ state: string; attempt: number }>(`SELECT state, attempt FROM "${schema}".jobs WHERE (payload->>'n')::int >= 1000`);
      const handedBack = rows.filter((r) => r.state === 'available');
      assert.ok(handedBack.length >= 10, `the 10 held jobs (and the running one, if aborted) are available again; saw ${handedBack.length}`);
      assert.ok(handedBack.every((r) => r.attempt === 0), 'no attempt spent on a job handed back');
      assert.ok(rows.every((r) => r.state === 'available' || (r.state === 'completed' && r.attempt === 1)), JSON.stringify(rows));
    });

    it('prefetch: a held job whose lease was taken over is dropped, not run', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob<{ n: number }>('queue.prefetch-lost', { queue: 'prefetch-lost' });
      await mailroom.enqueueMany(job, [{ n: 0 }, { n: 1 }, { n: 2 }]);
      let release!: () => void;
      const gate = new Promise<void>((r) => (release = r));
      const ran: number[] = [];
      const worker = mailroom.worker({
        queues: ['prefetch-lost'],
        concurrency: 1,
        prefetch: 5,
        lease: 150,
        maintenance: false,
        handlers: { [job.name]: async (j: Job<{ n: number }>) => { ran.push(j.data.n); if (j.data.n === 0) await gate; } },
      });
      await worker.start();
      await eventually(async () => (await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE state = 'active'`))[0]!.n === 3);
      // Another worker takes job 2 over (as after a rescue and a new claim): its claim token moves on.
      const dropped = waitForEvents(worker, 'stale', 1);
      await sql(`UPDATE "${schema}".jobs SET claim_count = claim_count + 1 WHERE payload->>'n' = '2'`);
      await dropped; // the next heartbeat (every 50 ms) finds it no longer ours
      const done = waitForEvents(worker, 'completed', 2);
      release();
      await done;
      await worker.stop();
      assert.deepEqual(ran.sort(), [0, 1], 'job 2 was dropped from the held jobs, not run by the stale claim');
    });

    it('prefetch: a crashed worker\'s held jobs are rescued and run', async () => {
      const { mailroom } = await db.open();
      const job = defineJob('queue.prefetch-crash', { queue: 'prefetch-crash' });
      await mailroom.enqueueMany(job, Array.from({ length: 12 }, () => ({})));
      const crashing = mailroom.worker({ queues: ['prefetch-crash'], concurrency: 1, prefetch: 20, lease: 150, maintenance: false, handlers: { [job.name]: () => new Promise(() => {}) } });
      await crashing.start();
      await eventually(() => crashing.activeCount === 1);
      crashing.abandon();
      const fresh = mailroom.worker({ queues: ['prefetch-crash'], concurrency: 4, pollInterval: 20, handlers: { [job.name]: () => {} } });
      const done = waitForEvents(fresh, 'completed', 12);
      await fresh.start();
      await eventually(async () => (await mailroom.maintain()).rescued > 0 || (await mailroom.stats()).queues['prefetch-crash']?.active === 0, 10_000, 'rescue');
      await done;
      await fresh.stop();
      assert.equal((await mailroom.stats()).queues['prefetch-crash']?.active ?? 0, 0);
    });

    it('heartbeats every 100 ms over hundreds of held jobs never deadlock with the batched completions', { skip: db.name === 'pglite' && 'one connection: no two statements run at once' }, async () => {
      // A heartbeat and a completion both update many of this worker's rows; PostgreSQL locks them in
      // plan order, so run at once on two connections they could deadlock (seen in the benchmark).
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob('queue.heartbeat-race', { queue: 'heartbeat-race' });
      const total = 3000;
      await mailroom.enqueueMany(job, Array.from({ length: total }, () => ({})));
      const worker = mailroom.worker({
        queues: ['heartbeat-race'],
        concurrency: 20,
        prefetch: 500,
        lease: 300, // heartbeat every 100 ms
        handlers: { [job.name]: () => new Promise<void>((resolve) => setImmediate(resolve)) },
      });
      const errors: unknown[] = [];
      const stale: string[] = [];
      worker.on('error', (error) => errors.push(error));
      worker.on('stale', (j) => stale.push(j.id));
      const done = waitForEvents(worker, 'completed', total, 60_000);
      await worker.start();
      await done;
      await worker.stop();
      assert.deepEqual(errors.map((e) => (e instanceof Error ? e.message : String(e))), []);
      assert.deepEqual(stale, []);
      const rows = await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE state = 'completed' AND attempt = 1`);
      assert.equal(rows[0]!.n, total);
    });

    it('slow completions slow the claims: never more than 3 x (concurrency + prefetch) jobs active', { skip: db.name === 'pglite' && 'needs a pool to slow down' }, async () => {
      // Completions are delayed 200 ms on their way to a real PostgreSQL (each pooled connection's query
      // is wrapped: mailroom runs its statements on checked-out clients); a worker that did not count
      // jobs whose completion is in flight kept claiming (seen in the 1M-backlog benchmark: 568,340 jobs
      // active at once).
      const pool = new pg.Pool({ connectionString: databaseUrl, max: 10 });
      let delayed = 0;
      beforeEachStatement(pool, (name) => {
        if (!name.includes('_complete_')) return;
        delayed++;
        return new Promise((resolve) => setTimeout(resolve, 200));
      });
      const schema = uniqueSchema('backpressure');
      const mailroom = await createMailroom({ database: pool, schema });
      await mailroom.migrate();
      const sql = async <R,>(text: string) => (await pool.query(text)).rows as R[];
      const job = defineJob('queue.backpressure', { queue: 'backpressure' });
      const total = 300;
      await mailroom.enqueueMany(job, Array.from({ length: total }, () => ({})));
      const worker = mailroom.worker({ queues: ['backpressure'], concurrency: 5, prefetch: 10, pollInterval: 20, handlers: { [job.name]: () => {} } });
      let maxActive = 0;
      let sampling = true;
      const sampler = (async () => {
        while (sampling) {
          const rows = await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE state = 'active'`);
          maxActive = Math.max(maxActive, rows[0]!.n);
          await new Promise((resolve) => setTimeout(resolve, 10));
        }
      })();
      const done = waitForEvents(worker, 'completed', total, 60_000);
      await worker.start();
      await done;
      sampling = false;
      await sampler;
      await worker.stop();
      assert.ok(maxActive > 0, 'the sampler saw the worker at work');
      assert.ok(delayed > 0, 'completions were delayed');
      await mailroom.close();
      await sql(`DROP SCHEMA "${schema}" CASCADE`);
      await pool.end();
      assert.ok(maxActive <= 45, `at most 3 x (concurrency + prefetch) = 45 jobs active at once, saw ${maxActive}`);
    });

    itPlans(db, "a worker's fenced writes probe the primary key per id, even on statistics taken while no job was active", async (t, session) => {
      const job = defineJob<{ n: number }>('plan.noop', { queue: 'plan' });
      await t.mailroom.enqueueMany(job, Array.from({ length: 3000 }, (_, n) => ({ n })));
      // Every job waiting: the statistics say none is active (a backlog loaded, analyzed before its drain).
      await session.query(`ANALYZE "${t.schema}".jobs`);
      const q = jobQueries(`"${t.schema}"`);
      const claimed = await session.query<{ id: string; claim_count: number }>({ text: q.claim.text, values: ['plan', 1000, 30_000, 'plan-test'] });
      assert.equal(claimed.rowCount, 1000);
      const ids = `'{${claimed.rows.map((r) => r.id).join(',')}}'`;
      const claims = `'{${claimed.rows.map((r) => r.claim_count).join(',')}}'`;
      const writes = [
        ['complete', q.complete.text, `${ids}, ${claims}`],
        ['complete_recording_inbox', q.completeRecordingInbox.text, `${ids}, ${claims}, '{}', '{}'`],
        ['heartbeat', q.heartbeat.text, `${ids}, ${claims}, 30000`],
        ['release_many', q.releaseMany.text, `${ids}, ${claims}`],
        ['rescue', q.rescueExpired.text, `1000, 'lease expired'`],
      ] as const;
      // A worker's connection plans each statement for its batch first (custom), then keeps a generic plan
      // (the batch's size unknown). Reading every active job through the lease index and comparing each with
      // every id of the batch took 610 ms here for the generic plan (10-14 ms probing the primary key); lease
      // rescue of 1,000 expired leases among 3,000 active jobs took 476-515 ms (22-52 ms).
      for (const mode of PLAN_MODES) {
        for (const [name, text, args] of writes) {
          const plan = await explainPrepared(session, mode, `plan_${name}`, text, args, 'COSTS OFF');
          // (Lease rescue finds its expired leases through the lease index: `on jobs`, not the fenced `jobs j`.)
          assert.doesNotMatch(plan, /jobs_lease_idx on jobs j/, `${name}, ${mode}:\n${plan}`);
          const probes = /Nested Loop\n\s+->  (Function Scan on c|CTE Scan on expired e)\n\s+->  Index Scan using jobs_pkey on jobs j/.test(plan);
          const hashes = /Hash Cond: \(\((c|e)\.id = j\.id\)|Hash Cond: \(\(j\.id = (c|e)\.id\)/.test(plan);
          assert.ok(probes || hashes, `${name}, ${mode}: the join probes the primary key per id or hashes on it, never a loop comparing every pair:\n${plan}`);
        }
        // A single job's failure and snooze read every active job through the lease index on such statistics
        // (2,999 rows removed by the filter here): they look it up by its primary key.
        const [one] = claimed.rows;
        const single = [
          ['fail', q.fail.text, `'${one!.id}', ${one!.claim_count}, true, 1000, null, 'transient', 'failed', null`],
          ['reschedule', q.reschedule.text, `'${one!.id}', ${one!.claim_count}, 0, NULL, 'snoozed'`],
        ] as const;
        for (const [name, text, args] of single) {
          const plan = await explainPrepared(session, mode, `plan_${name}`, text, args, 'COSTS OFF');
          assert.doesNotMatch(plan, /jobs_lease_idx/, `${name}, ${mode}:\n${plan}`);
          assert.match(plan, /Index Scan using jobs_pkey on jobs/, `${name}, ${mode}:\n${plan}`);
        }
      }
    });

    itPlans(db, 'a claim updates the jobs it picked by primary key, however much completed history the table holds', async (t, session) => {
      const jobs = `"${t.schema}".jobs`;
      // 60,000 jobs, 2,000 of them waiting: with the picked jobs joined to the table, PostgreSQL hashed them
      // and read all 60,000 rows for each claim (19 ms against 6 for a claim of 1,000 here).
      await session.query(
        `INSERT INTO ${jobs} (id, queue, type, state, max_attempts, payload, finished_at)
         SELECT gen_random_uuid(), 'plan', 'plan.noop', CASE WHEN n <= 58000 THEN 'completed' ELSE 'available' END, 5, '{}',
                CASE WHEN n <= 58000 THEN now() END
           FROM generate_series(1, 60000) AS n`,
      );
      await session.query(`ANALYZE ${jobs}`);
      const q = jobQueries(`"${t.schema}"`);
      const controls = controlQueries(`"${t.schema}"`);
      await session.query(controls.configure.text, ['plan', null, null, 5000]);
      const claims = [
        ['claim', q.claim.text, `'plan', 1000, 30000, 'plan-test'`],
        ['claim_with_followers', q.claimWithFollowers.text, `'plan', 1000, 30000, 'plan-test', 0, '{}', '{}', 0`],
        ['claim_controlled', controls.claimControlled.text, `'plan', 1000, 30000, 'plan-test'`],
      ] as const;
      for (const mode of PLAN_MODES) {
        for (const [name, text, args] of claims) {
          await session.query('BEGIN');
          const plan = await explainPrepared(session, mode, name, text, args);
          await session.query('ROLLBACK');
          assert.match(plan, /Update on jobs j \(actual rows=1000 loops=1\)/, `${name}, ${mode}: 1,000 jobs claimed:\n${plan}`);
          assert.match(plan, /(Index Scan using jobs_pkey on jobs j|Bitmap Index Scan on jobs_pkey) \(actual rows=\d+ loops=1\)/, `${name}, ${mode}: the picked jobs found by primary key:\n${plan}`);
          assert.doesNotMatch(plan, /Seq Scan on jobs|Hash Join/, `${name}, ${mode}:\n${plan}`);
        }
      }
    });

    it('a worker starts the jobs of one claim in claim order: highest priority first, then oldest', async () => {
      const { mailroom } = await db.open();
      const job = defineJob<{ priority: number }>('queue.prioritised', { queue: 'prioritised' });
      // Enqueued lowest priority first, so that neither enqueue order nor id order is claim order.
      const priorities = [-5, 0, 3, -1, 7, 2, 9, 1, 4, 8];
      for (const priority of [...priorities].sort((a, b) => a - b)) await mailroom.enqueue(job, { priority }, { priority });
      const started: number[] = [];
      const worker = mailroom.worker({ queues: ['prioritised'], concurrency: 1, prefetch: 20, pollInterval: 20, handlers: { [job.name]: (j: Job<{ priority: number }>) => void started.push(j.data.priority) } });
      const done = waitForEvents(worker, 'completed', priorities.length);
      await worker.start();
      await done;
      await worker.stop();
      assert.deepEqual(started, [...priorities].sort((a, b) => b - a));
    });

    it('NOTIFY wakes an idle worker: a job runs without waiting for the poll', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob('queue.wake', { queue: 'wake' });
      const worker = mailroom.worker({ queues: ['wake'], pollInterval: '1h', handlers: { [job.name]: () => {} } });
      await worker.start();
      // Asleep for an hour: it recorded itself as sleeping (so the trigger notifies it) after an empty claim.
      const asleep = async () => {
        await eventually(async () => (await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".wake_listeners`))[0]!.n > 0, 10_000, 'the worker asleep');
        await new Promise((r) => setTimeout(r, 50)); // the claim after registering, which found nothing, has ended
      };
      await asleep();
      const first = waitForEvents(worker, 'completed', 1, 10_000);
      await mailroom.enqueue(job, {});
      await first;
      await asleep();
      const second = waitForEvents(worker, 'completed', 1, 10_000);
      await mailroom.transaction((tx) => mailroom.enqueue(job, {}, { tx }));
      await second;
      await worker.stop();
    });

    it('a stopped worker gives its LISTEN connection back to the pool; a new worker listens (and is woken) again', { skip: db.name === 'pglite' ? 'PGlite has no pool' : false }, async () => {
      const pool = new pg.Pool({ connectionString: databaseUrl, max: 4 });
      const schema = uniqueSchema('listen');
      const mailroom = await createMailroom({ database: pool, schema });
      try {
        await mailroom.migrate();
        const job = defineJob('queue.listen-release', { queue: 'listen-release' });
        const checkedOut = () => pool.totalCount - pool.idleCount;
        for (let round = 0; round < 3; round++) {
          const worker = mailroom.worker({ queues: ['listen-release'], pollInterval: '1h', handlers: { [job.name]: () => {} } });
          await worker.start();
          await eventually(() => checkedOut() === 1, 5000, 'the LISTEN connection');
          await new Promise((r) => setTimeout(r, 50)); // asleep for an hour: only NOTIFY can wake it
          const done = waitForEvents(worker, 'completed', 1, 10_000);
          await mailroom.enqueue(job, {});
          await done;
          await worker.stop();
          await eventually(() => checkedOut() === 0, 5000, 'every connection back in the pool after stop');
        }
      } finally {
        await mailroom.close();
        await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
        await pool.end();
      }
    });

    it('explains a missing migration', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob('queue.unmigrated', { queue: 'x' });
      await sql(`DROP SCHEMA "${schema}" CASCADE`);
      await assert.rejects(mailroom.enqueue(job, {}), /mailroom\.migrate\(\)/);
      await mailroom.migrate();
    });
  });
}
