/**
 * `mailroom.transaction(fn, { signal })` (src/transaction-options.ts), and
 * `enqueue`/`publish` (and their many forms) with `{ signal }` and no `tx`:
 * an abort ends the work, which rejects with the signal's reason and commits
 * nothing (a transaction's jobs and events with it); on PostgreSQL a
 * statement waiting for a lock is cancelled on the server first. Bad options
 * (and a signal beside a `tx`) are refused before anything runs.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import pg from 'pg';
import { defineEvent, defineJob, ValidationError } from '../src/index.ts';
import { testDatabases } from './helpers/databases.ts';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * How `work` settled within 5 s: its rejection's reason, 'resolved', or 'pending'. Bounded, so that
 * work still waiting for a lock fails the test instead of holding it (and the lock) past its timeout.
 */
/** Waits up to 10 s for `check` (a loaded machine connects slowly); the assertion after it says what was wanted. */
async function until(check: () => boolean | Promise<boolean>): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!(await check()) && Date.now() < deadline) await sleep(10);
}

const outcomeOf = (work: Promise<unknown>): Promise<unknown> =>
  Promise.race([work.then(() => 'resolved', (error: unknown) => error), sleep(5_000).then(() => 'pending')]);
const job = defineJob<{ n: number }>('txsignal.job', { queue: 'txsignal' });
const noted = defineEvent<{ n: number }>('txsignal.noted', { version: 1 });

for (const db of testDatabases()) {
  describe(`mailroom.transaction with a signal on ${db.name}`, () => {
    it('aborted while fn waits: rejects with the reason, and neither its writes nor its job commit', { timeout: 30_000 }, async () => {
      const { mailroom, schema, sql } = await db.open();
      await sql(`CREATE TABLE "${schema}".notes (n int)`);
      const controller = new AbortController();
      const reason = new Error('the request was cancelled');
      let reachedWait = false;
      const running = mailroom.transaction(async (tx) => {
        await tx.query(`INSERT INTO "${schema}".notes VALUES (1)`);
        await mailroom.enqueue(job, { n: 1 }, { tx });
        reachedWait = true;
        await new Promise<never>(() => {}); // a call that never answers
      }, { signal: controller.signal });
      await until(() => reachedWait);
      assert.ok(reachedWait, 'fn wrote and then waited');
      const began = Date.now();
      controller.abort(reason);
      assert.equal(await outcomeOf(running), reason, 'the transaction rejected with the reason');
      assert.ok(Date.now() - began < 2_000, `the transaction ended ${Date.now() - began} ms after the abort`);
      assert.deepEqual(await sql(`SELECT count(*)::int AS n FROM "${schema}".notes`), [{ n: 0 }], "fn's insert rolled back");
      assert.deepEqual(await sql(`SELECT count(*)::int AS n FROM "${schema}".jobs`), [{ n: 0 }], "fn's job rolled back");
      // The mailroom goes on: the next transaction commits.
      await mailroom.transaction(async (tx) => {
        await tx.query(`INSERT INTO "${schema}".notes VALUES (2)`);
      });
      assert.deepEqual(await sql(`SELECT n FROM "${schema}".notes`), [{ n: 2 }]);
    });

    it('a signal already aborted runs nothing; one never aborted changes nothing', { timeout: 30_000 }, async () => {
      const { mailroom, schema, sql } = await db.open();
      await sql(`CREATE TABLE "${schema}".notes (n int)`);
      const reason = new Error('too late');
      let called = false;
      await assert.rejects(
        mailroom.transaction(async () => {
          called = true;
        }, { signal: AbortSignal.abort(reason) }),
        (error) => error === reason,
      );
      assert.equal(called, false, 'fn was not called');
      const value = await mailroom.transaction(async (tx) => {
        await tx.query(`INSERT INTO "${schema}".notes VALUES (3)`);
        return 'done';
      }, { signal: new AbortController().signal });
      assert.equal(value, 'done');
      assert.deepEqual(await sql(`SELECT n FROM "${schema}".notes`), [{ n: 3 }]);
    });

    it('bad options are refused with the option named, before fn runs', { timeout: 30_000 }, async () => {
      const { mailroom } = await db.open();
      let called = false;
      const fn = async () => {
        called = true;
      };
      const cases: [unknown, RegExp][] = [
        [{ signal: 'soon' }, /mailroom\.transaction: signal must be an AbortSignal .*got string; nothing was run/],
        [{ signal: null }, /signal must be an AbortSignal .*got null/],
        [{ sigal: new AbortController().signal }, /mailroom\.transaction: unknown option "sigal"; did you mean "signal"\?/],
        ['5s', /mailroom\.transaction: options must be an object such as \{ signal \}, got string/],
        [[new AbortController().signal], /options must be an object .*got an array/],
      ];
      for (const [options, message] of cases) {
        await assert.rejects(
          mailroom.transaction(fn, options as Parameters<typeof mailroom.transaction>[1]),
          (error: unknown) => error instanceof ValidationError && message.test(error.message),
          `options ${JSON.stringify(options)}`,
        );
      }
      assert.equal(called, false, 'fn never ran');
    });

    it('enqueue and publish without tx: an aborted signal writes nothing and rejects with the reason; one never aborted writes', { timeout: 30_000 }, async () => {
      const { mailroom, schema, sql } = await db.open();
      const reason = new Error('gave up');
      const aborted = AbortSignal.abort(reason);
      const rejectsWithReason = (work: Promise<unknown>, what: string) => assert.rejects(work, (error) => error === reason, what);
      await rejectsWithReason(mailroom.enqueue(job, { n: 1 }, { signal: aborted }), 'enqueue');
      await rejectsWithReason(mailroom.enqueue(job, { n: 1 }, { signal: aborted, key: 'k', orderingKey: 'o' }), 'enqueue with keys');
      await rejectsWithReason(mailroom.enqueueMany(job, Array.from({ length: 70 }, (_, n) => ({ n })), { signal: aborted, orderingKey: (d) => `o${d.n % 3}` }), 'enqueueMany (keyed, set-wise)');
      await rejectsWithReason(mailroom.publish(noted, { n: 1 }, { signal: aborted }), 'publish');
      await rejectsWithReason(mailroom.publishMany(noted, [{ n: 1 }, { n: 2 }], { signal: aborted, key: 'k' }), 'publishMany (keyed)');
      assert.deepEqual(await sql(`SELECT (SELECT count(*) FROM "${schema}".jobs)::int AS jobs, (SELECT count(*) FROM "${schema}".outbox)::int AS events`), [{ jobs: 0, events: 0 }]);
      const live = new AbortController().signal;
      await mailroom.enqueue(job, { n: 2 }, { signal: live });
      await mailroom.enqueueMany(job, [{ n: 3 }, { n: 4 }], { signal: live, orderingKey: 'o' });
      await mailroom.publish(noted, { n: 2 }, { signal: live, key: 'k' });
      await mailroom.publishMany(noted, [{ n: 3 }, { n: 4 }], { signal: live });
      assert.deepEqual(await sql(`SELECT (SELECT count(*) FROM "${schema}".jobs)::int AS jobs, (SELECT count(*) FROM "${schema}".outbox)::int AS events`), [{ jobs: 3, events: 3 }]);
    });

    it('enqueue and publish refuse a signal that is not an AbortSignal, and one given with tx, writing nothing', { timeout: 30_000 }, async () => {
      const { mailroom, schema, sql } = await db.open();
      const bad = 'soon' as unknown as AbortSignal;
      const refused = (work: Promise<unknown>, message: RegExp) => assert.rejects(work, (error: unknown) => error instanceof ValidationError && message.test(error.message));
      await refused(mailroom.enqueue(job, { n: 1 }, { signal: bad }), /enqueue txsignal\.job: signal must be an AbortSignal .*got string/);
      await refused(mailroom.publishMany(noted, [{ n: 1 }], { signal: bad }), /publish txsignal\.noted: signal must be an AbortSignal/);
      await mailroom.transaction(async (tx) => {
        const signal = new AbortController().signal;
        await refused(mailroom.enqueueMany(job, [{ n: 1 }], { tx, signal }), /enqueue txsignal\.job: signal was given with tx; .*mailroom\.transaction\(fn, \{ signal \}\)/);
        await refused(mailroom.publish(noted, { n: 1 }, { tx, signal }), /publish txsignal\.noted: signal was given with tx/);
      });
      assert.deepEqual(await sql(`SELECT (SELECT count(*) FROM "${schema}".jobs)::int AS jobs, (SELECT count(*) FROM "${schema}".outbox)::int AS events`), [{ jobs: 0, events: 0 }]);
    });

    if (db.name === 'postgres') {
      it('an enqueue and a publish waiting for a table lock are cancelled on the server when their signal aborts', { timeout: 30_000 }, async () => {
        const { mailroom, schema, sql } = await db.open();
        const holder = await ((await db.handle()) as pg.Pool).connect();
        try {
          await holder.query('BEGIN');
          await holder.query(`LOCK TABLE "${schema}".jobs, "${schema}".outbox IN ACCESS EXCLUSIVE MODE`);
          const holderPid = (await holder.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
          const waiting = async () => (await sql<{ n: number }>('SELECT count(*)::int AS n FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))', [holderPid]))[0]!.n;
          const controller = new AbortController();
          const reason = new Error('deadline passed');
          const enqueuing = mailroom.enqueue(job, { n: 1 }, { signal: controller.signal });
          const publishing = mailroom.publish(noted, { n: 1 }, { signal: controller.signal });
          await until(async () => (await waiting()) === 2);
          assert.equal(await waiting(), 2, 'the enqueue and the publish wait for the lock');
          controller.abort(reason);
          // Both awaited at once: the one that rejects first must not be left without a handler meanwhile.
          const [enqueued, published] = await Promise.all([outcomeOf(enqueuing), outcomeOf(publishing)]);
          assert.equal(enqueued, reason, 'the enqueue rejected with the reason');
          assert.equal(published, reason, 'the publish rejected with the reason');
          await until(async () => (await waiting()) === 0);
          assert.equal(await waiting(), 0, 'nothing of them still waits for the lock');
        } finally {
          await holder.query('ROLLBACK').catch(() => {});
          holder.release();
        }
        assert.deepEqual(await sql(`SELECT (SELECT count(*) FROM "${schema}".jobs)::int AS jobs, (SELECT count(*) FROM "${schema}".outbox)::int AS events`), [{ jobs: 0, events: 0 }]);
      });


      it('aborted while a statement waits for a lock: the statement is cancelled on the server before the call rejects', { timeout: 30_000 }, async () => {
        const { mailroom, schema, sql } = await db.open();
        await sql(`CREATE TABLE "${schema}".rows (id int PRIMARY KEY, v int); INSERT INTO "${schema}".rows VALUES (1, 0)`);
        const holder = await ((await db.handle()) as pg.Pool).connect();
        try {
          await holder.query('BEGIN');
          await holder.query(`SELECT 1 FROM "${schema}".rows WHERE id = 1 FOR UPDATE`);
          const holderPid = (await holder.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
          const waiting = async () => (await sql<{ n: number }>('SELECT count(*)::int AS n FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))', [holderPid]))[0]!.n;
          const controller = new AbortController();
          const reason = new Error('deadline passed');
          const running = mailroom.transaction(async (tx) => {
            await mailroom.enqueue(job, { n: 2 }, { tx });
            await tx.query(`UPDATE "${schema}".rows SET v = 1 WHERE id = 1`);
          }, { signal: controller.signal });
          await until(async () => (await waiting()) > 0);
          assert.equal(await waiting(), 1, "the transaction's UPDATE waits for the lock");
          controller.abort(reason);
          assert.equal(await outcomeOf(running), reason, 'the transaction rejected with the reason');
          assert.equal(await waiting(), 0, 'nothing of the transaction still waits for the lock once it rejected');
          assert.deepEqual(await sql(`SELECT count(*)::int AS n FROM "${schema}".jobs`), [{ n: 0 }], 'its job rolled back');
        } finally {
          await holder.query('ROLLBACK').catch(() => {});
          holder.release();
        }
        assert.deepEqual(await sql(`SELECT v FROM "${schema}".rows`), [{ v: 0 }], 'its UPDATE never committed');
      });
    }
  });
}
