/**
 * A statement run with `{ signal }` (src/storage/driver.ts), as the background
 * passes run theirs so that a stop can cancel one blocked on a lock: on
 * PostgreSQL a statement in flight is cancelled on the server and rejects with
 * the signal's reason, and its connection is closed rather than handed to the
 * next caller (a cancel request arriving late must not cancel someone else's
 * statement); a signal aborted before the statement means it is not run, on
 * PostgreSQL and on PGlite.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import pg from 'pg';
import { PgDriver } from '../src/storage/pg-driver.ts';
import { PgliteDriver } from '../src/storage/pglite-driver.ts';
import { openPglite } from '../src/storage/pglite-open.ts';
import { databaseUrl, uniqueSchema } from './helpers/databases.ts';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('statements cancelled by a signal (PostgreSQL)', { skip: databaseUrl ? false : 'set TEST_DATABASE_URL' }, () => {
  it('a statement in flight is cancelled on the server, rejects with the reason, and its connection is not reused', async () => {
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 2 });
    const driver = new PgDriver(pool, true);
    const admin = new pg.Client({ connectionString: databaseUrl });
    await admin.connect();
    try {
      const controller = new AbortController();
      const reason = new Error('stop waited long enough');
      const began = Date.now();
      const sleeping = driver.query(`SELECT pg_sleep(30), 'cancel-probe' AS tag`, [], { signal: controller.signal });
      // Its backend, once the statement runs.
      let pid: number | undefined;
      for (let i = 0; i < 200 && pid === undefined; i++) {
        const { rows } = await admin.query<{ pid: number }>(`SELECT pid FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(30), ''cancel-probe''%' AND state = 'active'`);
        pid = rows[0]?.pid;
        if (pid === undefined) await sleep(10);
      }
      assert.ok(pid !== undefined, 'the statement began on the server');
      controller.abort(reason);
      await assert.rejects(sleeping, (error) => error === reason);
      assert.ok(Date.now() - began < 10_000, 'it was cancelled, not run to its end');
      // The cancelled backend's connection was closed: its process goes away, and the pool opens another.
      for (let i = 0; i < 200; i++) {
        const { rows } = await admin.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = $1', [pid]);
        if (rows[0]!.n === 0) break;
        await sleep(10);
      }
      const { rows: gone } = await admin.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = $1', [pid]);
      assert.equal(gone[0]!.n, 0, 'the connection of the cancelled statement was closed, not put back in the pool');
      // The next statements (with a signal and without) run to their end.
      const next = await driver.query<{ pid: number }>('SELECT pg_backend_pid() AS pid, pg_sleep(0.2)', [], { signal: new AbortController().signal });
      assert.notEqual(next.rows[0]!.pid, pid);
      const plain = await driver.query<{ one: number }>('SELECT 1 AS one');
      assert.equal(plain.rows[0]!.one, 1);
    } finally {
      await admin.end();
      await driver.close();
    }
  });

  it("a transaction aborted while its statement waits for a lock rejects only once that statement ended on the server", { timeout: 60_000 }, async () => {
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 4 });
    const driver = new PgDriver(pool, true);
    const admin = new pg.Client({ connectionString: databaseUrl });
    await admin.connect();
    const schema = uniqueSchema('txcancel');
    try {
      await admin.query(`CREATE SCHEMA "${schema}"; CREATE TABLE "${schema}".t (id int PRIMARY KEY); INSERT INTO "${schema}".t VALUES (1)`);
      await admin.query('BEGIN');
      await admin.query(`SELECT 1 FROM "${schema}".t WHERE id = 1 FOR UPDATE`);
      const adminPid = (await admin.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
      const waiting = async () => {
        await admin.query('SELECT pg_stat_clear_snapshot()');
        return (await admin.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))', [adminPid])).rows[0]!.n;
      };
      // Ten rounds: the rejection and the server's end of the statement must not race.
      for (let round = 0; round < 10; round++) {
        const controller = new AbortController();
        const reason = new Error(`round ${round} stopped`);
        const locking = driver.transaction((tx) => tx.query(`UPDATE "${schema}".t SET id = 1 WHERE id = 1`), { signal: controller.signal });
        for (let i = 0; i < 400 && (await waiting()) === 0; i++) await sleep(5);
        assert.equal(await waiting(), 1, `round ${round}: the transaction's statement waits for the lock`);
        controller.abort(reason);
        await assert.rejects(locking, (error) => error === reason);
        assert.equal(await waiting(), 0, `round ${round}: the transaction rejected while its statement still waited for the lock`);
      }
    } finally {
      await admin.query('ROLLBACK').catch(() => {});
      await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await admin.end();
      await driver.close();
    }
  });

  it('a transaction aborted during its COMMIT: a COMMIT the cancel makes fail rejects with the reason and commits nothing', { timeout: 60_000 }, async () => {
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 2 });
    const driver = new PgDriver(pool, true);
    const admin = new pg.Client({ connectionString: databaseUrl });
    await admin.connect();
    const schema = uniqueSchema('commitcancel');
    try {
      // A deferred trigger runs inside the COMMIT: cancelled there, the COMMIT fails and the transaction rolls back.
      await admin.query(`CREATE SCHEMA "${schema}"; CREATE TABLE "${schema}".t (id int);
        CREATE FUNCTION "${schema}".slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(30); RETURN NULL; END $$;
        CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON "${schema}".t DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "${schema}".slow()`);
      const controller = new AbortController();
      const reason = new Error('stopped during COMMIT');
      const committing = driver.transaction((tx) => tx.query(`INSERT INTO "${schema}".t VALUES (1)`), { signal: controller.signal });
      const inCommit = async () => (await admin.query<{ n: number }>(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE query = 'COMMIT' AND wait_event = 'PgSleep'`)).rows[0]!.n > 0;
      for (let i = 0; i < 400 && !(await inCommit()); i++) await sleep(10);
      assert.ok(await inCommit(), "the transaction's COMMIT runs the deferred trigger");
      const began = Date.now();
      controller.abort(reason);
      await assert.rejects(committing, (error) => error === reason);
      assert.ok(Date.now() - began < 5_000, `the aborted COMMIT took ${Date.now() - began} ms to end (its trigger sleeps 30 s)`);
      assert.equal((await admin.query<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".t`)).rows[0]!.n, 0, 'nothing committed');
    } finally {
      await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await admin.end();
      await driver.close();
    }
  });

  it('a signal aborted before the statement: it is not run', async () => {
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 1 });
    const driver = new PgDriver(pool, true);
    const schema = uniqueSchema('cancel');
    try {
      await driver.query(`CREATE SCHEMA "${schema}"`);
      await driver.query(`CREATE TABLE "${schema}".t (n int)`);
      const reason = new Error('already stopping');
      await assert.rejects(driver.query(`INSERT INTO "${schema}".t VALUES (1)`, [], { signal: AbortSignal.abort(reason) }), (error) => error === reason);
      await assert.rejects(driver.run({ name: 'cancel_insert', text: `INSERT INTO "${schema}".t VALUES (2)` }, [], { signal: AbortSignal.abort(reason) }), (error) => error === reason);
      const { rows } = await driver.query<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".t`);
      assert.equal(rows[0]!.n, 0);
    } finally {
      await driver.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => {});
      await driver.close();
    }
  });
});

describe('statements cancelled by a signal (PGlite)', () => {
  it('a signal aborted before the statement: it is not run; one never aborted changes nothing', async () => {
    const { db } = await openPglite();
    const driver = new PgliteDriver(db, true);
    try {
      await driver.query('CREATE TABLE t (n int)');
      const reason = new Error('already stopping');
      await assert.rejects(driver.query('INSERT INTO t VALUES (1)', [], { signal: AbortSignal.abort(reason) }), (error) => error === reason);
      await assert.rejects(driver.run({ name: 'insert', text: 'INSERT INTO t VALUES (2)' }, [], { signal: AbortSignal.abort(reason) }), (error) => error === reason);
      await driver.query('INSERT INTO t VALUES (3)', [], { signal: new AbortController().signal });
      const { rows } = await driver.query<{ n: number }>('SELECT n FROM t');
      assert.deepEqual(rows, [{ n: 3 }]);
    } finally {
      await driver.close();
    }
  });
});
