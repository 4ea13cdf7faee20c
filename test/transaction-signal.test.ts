/**
 * `mailroom.transaction(fn, { signal })` (src/transaction-options.ts): an
 * abort ends the transaction, which rejects with the signal's reason and
 * commits nothing (its jobs and events with it); on PostgreSQL a statement
 * waiting for a lock is cancelled on the server first. Bad options are
 * refused before anything runs.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import pg from 'pg';
import { defineJob, ValidationError } from '../src/index.ts';
import { testDatabases } from './helpers/databases.ts';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const job = defineJob<{ n: number }>('txsignal.job', { queue: 'txsignal' });

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
      for (let i = 0; i < 200 && !reachedWait; i++) await sleep(5);
      assert.ok(reachedWait, 'fn wrote and then waited');
      const began = Date.now();
      controller.abort(reason);
      await assert.rejects(running, (error) => error === reason);
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

    if (db.name === 'postgres') {
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
          for (let i = 0; i < 400 && (await waiting()) === 0; i++) await sleep(5);
          assert.equal(await waiting(), 1, "the transaction's UPDATE waits for the lock");
          controller.abort(reason);
          await assert.rejects(running, (error) => error === reason);
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
