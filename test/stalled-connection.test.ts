/**
 * Pooled connections cut off without a reset (src/storage/stalled-statements.ts).
 * A failover to another host, a partition or a NAT that dropped a connection's
 * state leaves the connection looking open: without a check, every statement
 * sent on it waits for the operating system to give up (about 15 minutes), and
 * a worker stops claiming. Here a TCP proxy (test/reliability/fault-proxy.ts)
 * stalls the connections open at a moment, as such a fault would; the server
 * behind it is real. A stalled statement must be given up on once the server
 * says it is not running it, a statement the server is running must not, and
 * a worker must go on with new connections.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import pg from 'pg';
import { PgDriver } from '../src/storage/pg-driver.ts';
import { StalledConnectionError, StalledStatements, type StallCheck } from '../src/storage/stalled-statements.ts';
import { openMailroom } from '../src/mailroom.ts';
import { createMailroom, defineJob, type Mailroom } from '../src/index.ts';
import { databaseUrl, uniqueSchema } from './helpers/databases.ts';
import { FaultProxy } from './reliability/fault-proxy.ts';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const QUICK: StallCheck = { afterMs: 400, everyMs: 100, answerMs: 3000 };
const LISTEN_QUICK = { everyMs: 300, answerMs: 500 };

/**
 * Watches `statement` on a stalled connection: after `during` it must still be waiting (nothing gave
 * up on it); then `proxy` closes, as the operating system would end the connection at last, and it
 * must fail with the connection's own end, not a StalledConnectionError.
 */
async function waitsUntilTheConnectionEnds(statement: Promise<unknown>, during: Promise<unknown>, proxy: FaultProxy, what: string): Promise<void> {
  let outcome: unknown = 'pending';
  const settled = statement.then(
    () => (outcome = 'answered'),
    (error: unknown) => (outcome = error),
  );
  await during;
  assert.equal(outcome, 'pending', `the statement is still waiting ${what}`);
  await proxy.close();
  await settled;
  const ended: unknown = outcome;
  assert.ok(ended instanceof Error && !(ended instanceof StalledConnectionError), `it failed with the connection's own end, not given up on: ${String(ended)}`);
}

/** The pool's one connection, made and handed back, and its `'end'` listeners before any mailroom used it. */
async function firstConnection(pool: pg.Pool): Promise<{ client: pg.PoolClient; before: number }> {
  const client = await pool.connect();
  client.release();
  return { client, before: client.listenerCount('end') };
}

/** A mailroom on `pool` that has run a transaction (so its stall check looked the connection up). */
async function mailroomThatRan(pool: pg.Pool, prefix: string): Promise<Mailroom> {
  const mailroom = await createMailroom({ database: pool, schema: uniqueSchema(prefix) });
  try {
    await mailroom.transaction((tx) => tx.query('SELECT 1'));
  } catch (error) {
    await mailroom.close();
    throw error;
  }
  return mailroom;
}

/** Waits until `done()`, failing naming `what` after 5 s. */
async function waitFor(what: string, done: () => boolean): Promise<void> {
  for (const deadline = Date.now() + 5_000; !done(); ) {
    assert.ok(Date.now() < deadline, `${what} within 5 s`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** A fault proxy of its own in front of the test server, and the server's URL through it. */
async function proxied(): Promise<{ proxy: FaultProxy; url: string }> {
  const server = new URL(databaseUrl!);
  const proxy = await FaultProxy.start({ host: server.hostname, port: Number(server.port || 5432) });
  const url = new URL(databaseUrl!);
  url.hostname = '127.0.0.1';
  url.port = String(proxy.port);
  return { proxy, url: url.toString() };
}

describe('pooled connections that stopped answering (PostgreSQL)', { skip: databaseUrl ? false : 'set TEST_DATABASE_URL' }, () => {
  let proxy: FaultProxy;
  let admin: pg.Pool;
  let through: string;

  before(async () => {
    ({ proxy, url: through } = await proxied());
    admin = new pg.Pool({ connectionString: databaseUrl, max: 2 });
  });
  after(async () => {
    await admin.end();
    await proxy.close();
  });

  /** A driver whose pool reaches the server through the proxy. */
  const driverThroughProxy = (check: StallCheck = QUICK, max = 4) => new PgDriver(new pg.Pool({ connectionString: through, max }), true, LISTEN_QUICK, check);

  it('a statement on a stalled connection is given up on, and the next one runs on a new connection', { timeout: 30_000 }, async () => {
    const driver = driverThroughProxy();
    try {
      await driver.query('SELECT 1');
      assert.ok(proxy.stallOpen() >= 1);
      const began = Date.now();
      await assert.rejects(driver.query('SELECT 2'), (error: unknown) => {
        assert.ok(error instanceof StalledConnectionError, `a StalledConnectionError, got ${String(error)}`);
        assert.match(error.message, /PostgreSQL stopped answering a connection: a statement waited \d+ ms and its server process \(\d+\) has been idle/);
        assert.match(error.message, /The connection was closed/);
        return true;
      });
      const waited = Date.now() - began;
      assert.ok(waited >= QUICK.afterMs && waited < 5000, `given up on after ${waited} ms (looked at after ${QUICK.afterMs} ms)`);
      const { rows } = await driver.query<{ n: number }>('SELECT 3 AS n');
      assert.deepEqual(rows, [{ n: 3 }]);
    } finally {
      await driver.close();
    }
  });

  it("a connection of a pool passed in that stalled before mailroom's first statement on it is given up on after answerMs", { timeout: 30_000 }, async () => {
    const pool = new pg.Pool({ connectionString: through, max: 2 });
    pool.on('error', () => {});
    const driver = new PgDriver(pool, false, LISTEN_QUICK, QUICK);
    try {
      await pool.query('SELECT 1'); // the application's own statement: the connection is in the pool, unknown to mailroom
      proxy.stallOpen();
      const began = Date.now();
      await assert.rejects(driver.query('SELECT 2'), (error: unknown) => error instanceof StalledConnectionError && /did not answer a pooled connection's first statement within 3000 ms/.test(error.message));
      const waited = Date.now() - began;
      assert.ok(waited >= QUICK.answerMs && waited < QUICK.answerMs + 2000, `given up on after ${waited} ms`);
      assert.deepEqual((await driver.query<{ n: number }>('SELECT 3 AS n')).rows, [{ n: 3 }], 'the next statement runs on a new connection');
    } finally {
      await driver.close();
      await pool.end();
    }
  });

  it('statements the server is running (a long one, one waiting for a lock) are not given up on', { timeout: 30_000 }, async () => {
    const driver = driverThroughProxy();
    const table = `stall_lock_${process.pid}`;
    await admin.query(`CREATE TABLE ${table} (id int)`);
    const holder = await admin.connect();
    try {
      const { rows } = await driver.query<{ done: boolean }>('SELECT true AS done FROM pg_sleep(1.2)');
      assert.deepEqual(rows, [{ done: true }], 'a statement running three times as long as afterMs came back');
      await holder.query(`BEGIN; LOCK TABLE ${table} IN ACCESS EXCLUSIVE MODE`);
      const connections = proxy.stats().connections;
      const waiting = driver.query(`SELECT count(*)::int AS n FROM ${table}`);
      await sleep(3500);
      await holder.query('COMMIT');
      assert.deepEqual((await waiting).rows, [{ n: 0 }], 'a statement that waited 3.5 s for a lock came back');
      // Each look connects anew (through the proxy): at 0.4, 0.8, 1.6 and 3.2 s, not every 100 ms.
      const looks = proxy.stats().connections - connections;
      assert.ok(looks >= 3 && looks <= 6, `${looks} looks while the statement waited 3.5 s`);
      await driver.transaction(async (tx) => {
        await tx.query('SELECT pg_sleep(1)');
      });
    } finally {
      holder.release();
      await admin.query(`DROP TABLE ${table}`);
      await driver.close();
    }
  });

  it('a transaction on a stalled connection is given up on and commits nothing', { timeout: 30_000 }, async () => {
    const driver = driverThroughProxy();
    const table = `stall_tx_${process.pid}`;
    await admin.query(`CREATE TABLE ${table} (id int)`);
    try {
      await assert.rejects(
        driver.transaction(async (tx) => {
          await tx.query(`INSERT INTO ${table} VALUES (1)`);
          proxy.stallOpen();
          await tx.query(`INSERT INTO ${table} VALUES (2)`);
        }),
        (error: unknown) => error instanceof StalledConnectionError && /idle in transaction/.test(error.message),
      );
      const { rows } = await admin.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${table}`);
      assert.deepEqual(rows, [{ n: 0 }], 'nothing of the cut-off transaction committed');
      await driver.transaction(async (tx) => {
        await tx.query(`INSERT INTO ${table} VALUES (3)`);
      });
      const after = await admin.query<{ id: number }>(`SELECT id FROM ${table}`);
      assert.deepEqual(after.rows, [{ id: 3 }], 'the next transaction ran on a new connection');
    } finally {
      await admin.query(`DROP TABLE ${table}`);
      await driver.close();
    }
  });

  it('a slow network is not a stall: a statement answered while the look ran is left alone, and so is its connection', { timeout: 30_000 }, async () => {
    // Each chunk held 300 ms each way: every statement is outstanding 600 ms, past afterMs (400), and its
    // server process sits idle in its transaction from when it answered, through the work the client does
    // after it (a handler's, here a pause). The look connects through the same proxy, so the statement's
    // answer, sent earlier, arrives before the look's.
    const { proxy: slow, url } = await proxied();
    const driver = new PgDriver(new pg.Pool({ connectionString: url, max: 2 }), true, LISTEN_QUICK, QUICK);
    const table = `stall_slow_${process.pid}`;
    await admin.query(`CREATE TABLE ${table} (id int)`);
    try {
      await driver.query('SELECT 1'); // connected and identified before the latency
      slow.latency(300);
      await driver.transaction(async (tx) => {
        for (let i = 1; i <= 3; i++) {
          await tx.query(`INSERT INTO ${table} VALUES ($1)`, [i]);
          await sleep(1500);
        }
      });
      const { rows } = await admin.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${table}`);
      assert.deepEqual(rows, [{ n: 3 }], 'the slow transaction committed');
      assert.ok(slow.stats().connections >= 3, `the statements were looked at (${slow.stats().connections - 1} look connections)`);
    } finally {
      await admin.query(`DROP TABLE ${table}`);
      await driver.close();
      await slow.close().catch(() => {});
    }
  });

  it("mailrooms made on a pool passed in and closed leave no listener on the pool's connections", { timeout: 30_000 }, async () => {
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 2 });
    pool.on('error', () => {});
    try {
      const { client, before } = await firstConnection(pool);
      for (let i = 0; i < 12; i++) await (await mailroomThatRan(pool, 'stallend')).close();
      assert.equal(pool.totalCount, 1, 'the same pooled connection served every mailroom');
      assert.equal(client.listenerCount('end'), before, `'end' listeners on the pooled connection: ${client.listenerCount('end')}, ${before} before twelve mailrooms came and went`);
    } finally {
      await pool.end();
    }
  });

  it("twelve mailrooms open at once on one pool passed in share one 'end' listener per connection: no leak warning", { timeout: 30_000 }, async () => {
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 1 });
    pool.on('error', () => {});
    const warnings: string[] = [];
    const onWarning = (warning: Error) => warnings.push(`${warning.name}: ${warning.message}`);
    process.on('warning', onWarning);
    const mailrooms: Mailroom[] = [];
    try {
      const { client, before } = await firstConnection(pool);
      for (let i = 0; i < 12; i++) mailrooms.push(await mailroomThatRan(pool, 'stallshare'));
      assert.equal(pool.totalCount, 1, 'the same pooled connection served every mailroom');
      assert.equal(client.listenerCount('end'), before + 1, `'end' listeners with twelve mailrooms open: ${client.listenerCount('end')}, ${before} before`);
      // Each mailroom still hears of the connection's end: the next statement of any of them gets a new one.
      await admin.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1', [(client as unknown as { processID: number }).processID]);
      await waitFor('the terminated connection left the pool', () => pool.totalCount === 0);
      for (const mailroom of mailrooms) await mailroom.transaction((tx) => tx.query('SELECT 1'));
      for (const mailroom of mailrooms.splice(0)) await mailroom.close();
      const next = await pool.connect();
      next.release();
      assert.equal(next.listenerCount('end'), before, `'end' listeners on the new connection once the twelve closed: ${next.listenerCount('end')}, ${before} on the first before any`);
      await new Promise((resolve) => setImmediate(resolve));
      assert.deepEqual(warnings.filter((w) => /MaxListeners/.test(w)), [], 'a listener leak warning');
    } finally {
      process.off('warning', onWarning);
      for (const mailroom of mailrooms) await mailroom.close();
      await pool.end();
    }
  });

  it('a connection made while a look runs is not taken for gone for being absent from its answer', { timeout: 30_000 }, async () => {
    // The look's own connection waits at a gate (the server is real), so a second connection is made while it runs.
    let openGate = () => {};
    const gate = new Promise<void>((resolve) => (openGate = resolve));
    let lookWaiting = false;
    let lookEnded = false;
    class GatedClient extends pg.Client {
      constructor(config?: pg.ClientConfig) {
        super(config);
        if (config?.application_name !== 'mailroom stall check') return;
        // The look calls both in their promise form.
        const connect = this.connect.bind(this) as () => Promise<pg.Client>;
        const end = this.end.bind(this) as () => Promise<void>;
        Object.assign(this, {
          connect: async () => {
            lookWaiting = true;
            await gate;
            return connect();
          },
          end: async () => {
            lookEnded = true;
            return end();
          },
        });
      }
    }
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 3, Client: GatedClient });
    pool.on('error', () => {});
    const stalls = new StalledStatements(pool, { afterMs: 100, everyMs: 20, answerMs: 10_000 });
    try {
      const first = await stalls.checkout();
      const long = stalls.track(first, first.query('SELECT pg_sleep(1)'));
      await waitFor('a look began', () => lookWaiting);
      const second = await stalls.checkout();
      const pid = stalls.serverPid(second);
      assert.ok(pid !== undefined, 'the new connection was looked up');
      second.release();
      openGate();
      await waitFor('the look ended', () => lookEnded);
      await long;
      first.release();
      const again = [await stalls.checkout(), await stalls.checkout()];
      try {
        assert.ok(again.some((client) => stalls.serverPid(client) === pid), 'the connection made during the look was discarded as gone');
        assert.equal(pool.totalCount, 2, 'both connections were kept');
      } finally {
        for (const client of again) client.release();
      }
    } finally {
      openGate();
      stalls.stop();
      await pool.end();
    }
  });

  it('connections whose server process is gone are given up on together: the next statement does not wait on them', { timeout: 30_000 }, async () => {
    const check: StallCheck = { afterMs: 1000, everyMs: 100, answerMs: 3000 };
    const driver = driverThroughProxy(check, 4);
    try {
      const pids = await Promise.all([1, 2, 3].map(async () => (await driver.query<{ pid: number }>('SELECT pg_backend_pid() AS pid, pg_sleep(0.1)')).rows[0]!.pid));
      assert.equal(new Set(pids).size, 3, 'three pooled connections');
      proxy.stallOpen();
      // As after a failover: the server the connections talked to no longer has their processes.
      await admin.query('SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid', [pids]);
      await assert.rejects(driver.query('SELECT 1'), (error: unknown) => error instanceof StalledConnectionError && /no longer has its process/.test(error.message));
      const began = Date.now();
      await driver.query('SELECT 2');
      const took = Date.now() - began;
      assert.ok(took < check.afterMs, `the next statement took ${took} ms: it must not wait on the other stalled connections`);
    } finally {
      await driver.close();
    }
  });

  it('behind a pooler (its own process ids in the startup reply, as PgBouncer gives) a stalled statement is not given up on: mailroom cannot know the server process', { timeout: 30_000 }, async () => {
    // What PgBouncer does to the one thing the check reads from the connection: the BackendKeyData
    // process id is the pooler's, not the server's. The server and the stall are real.
    class PooledClient extends pg.Client {
      constructor(config?: pg.ClientConfig) {
        super(config);
        // Set once the startup reply is read (pg-pool connects with a callback, after which it is read).
        this.once('connect', () => {
          const self = this as unknown as { processID: number };
          self.processID = -self.processID;
        });
      }
    }
    const { proxy: ownProxy, url } = await proxied();
    const driver = new PgDriver(new pg.Pool({ connectionString: url, max: 2, Client: PooledClient }), true, LISTEN_QUICK, QUICK);
    try {
      await driver.query('SELECT 1');
      ownProxy.stallOpen();
      await waitsUntilTheConnectionEnds(driver.query('SELECT 2'), sleep(QUICK.afterMs * 4), ownProxy, 'after four times afterMs');
    } finally {
      await driver.close();
      await ownProxy.close().catch(() => {});
    }
  });

  it('an answer the server cannot write back (nothing reads the connection) is given up on, and its server process ended', { timeout: 30_000 }, async () => {
    const { proxy: ownProxy, url } = await proxied();
    const driver = new PgDriver(new pg.Pool({ connectionString: url, max: 1 }), true, LISTEN_QUICK, QUICK);
    try {
      const { rows } = await driver.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
      const pid = rows[0]!.pid;
      assert.ok(ownProxy.stallOpen({ wayBackOnly: true }) >= 1);
      const began = Date.now();
      // 64 MB: far more than the sockets between the server and the proxy hold, so the server blocks writing it.
      await assert.rejects(driver.query(`SELECT repeat('x', 64 * 1024 * 1024) AS big`), (error: unknown) => {
        assert.ok(error instanceof StalledConnectionError, `a StalledConnectionError, got ${String(error)}`);
        assert.match(error.message, /has been blocked writing the answer to the connection \(ClientWrite\)/);
        return true;
      });
      const waited = Date.now() - began;
      assert.ok(waited < 10_000, `given up on after ${waited} ms (afterMs ${QUICK.afterMs}: looked at twice)`);
      // Its server process is ended (its transaction's locks with it), not left blocked until the proxy goes.
      let alive = 1;
      for (let i = 0; i < 100 && alive > 0; i++) {
        alive = (await admin.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = $1', [pid])).rows[0]!.n;
        if (alive > 0) await sleep(50);
      }
      assert.equal(alive, 0, `the server process ${pid} blocked writing is still there`);
      const next = await driver.query<{ one: number }>('SELECT 1 AS one');
      assert.equal(next.rows[0]!.one, 1, 'the next statement runs on a new connection');
    } finally {
      await ownProxy.close().catch(() => {});
      await driver.close();
    }
  });

  it("createMailroom's stallCheck sets when a stalled connection is given up on; false leaves its statements waiting", { timeout: 60_000 }, async () => {
    const { proxy: ownProxy, url } = await proxied();
    const quick = await createMailroom({ database: url, poolSize: 2, stallCheck: { after: '500ms', every: '100ms', answer: '3s' } });
    const off = await createMailroom({ database: url, poolSize: 2, stallCheck: false });
    try {
      await quick.transaction((tx) => tx.query('SELECT 1'));
      await off.transaction((tx) => tx.query('SELECT 1'));
      assert.ok(ownProxy.stallOpen() >= 2, 'both connections stalled');
      const givenUpOn = (async () => {
        const began = Date.now();
        await assert.rejects(quick.transaction((tx) => tx.query('SELECT 2')), (error: unknown) => {
          assert.ok(error instanceof StalledConnectionError, `a StalledConnectionError, got ${String(error)}`);
          return true;
        });
        const waited = Date.now() - began;
        assert.ok(waited >= 500 && waited < 5000, `given up on after ${waited} ms with stallCheck.after 500 ms (the default is 15 s)`);
        await sleep(2000);
      })();
      await waitsUntilTheConnectionEnds(off.transaction((tx) => tx.query('SELECT 2')), givenUpOn, ownProxy, 'with stallCheck: false, 2 s past when the other was given up on');
    } finally {
      await ownProxy.close().catch(() => {});
      await quick.close({ timeout: '1s' });
      await off.close({ timeout: '1s' });
    }
  });

  it('a worker whose connections stall goes on claiming and completing on new ones', { timeout: 60_000 }, async () => {
    const schema = uniqueSchema('stall');
    const direct = await createMailroom({ database: databaseUrl, schema });
    await direct.migrate();
    const job = defineJob<{ n: number }>('stall.work', { queue: 'stall' });
    const stalled = await openMailroom({ schema }, async () => driverThroughProxy());
    const ran: number[] = [];
    const worker = stalled.worker({ queues: ['stall'], concurrency: 2, handlers: { [job.name]: async (j) => void ran.push((j.data as { n: number }).n) } });
    const errors: unknown[] = [];
    worker.on('error', (error) => errors.push(error));
    try {
      await worker.start();
      await direct.enqueue(job, { n: 1 });
      const until = async (n: number, ms: number) => {
        const deadline = Date.now() + ms;
        while (!ran.includes(n) && Date.now() < deadline) await sleep(50);
        return ran.includes(n);
      };
      assert.ok(await until(1, 10_000), 'the first job ran through the proxy');
      await sleep(300); // its completion written
      assert.ok(proxy.stallOpen() >= 1);
      await direct.enqueue(job, { n: 2 });
      assert.ok(await until(2, 20_000), `the job enqueued after the stall ran (errors: ${errors.map(String).join('; ')})`);
      const { rows } = await admin.query<{ state: string; attempt: number }>(`SELECT state, attempt FROM "${schema}".jobs ORDER BY created_at`);
      const deadline = Date.now() + 10_000;
      let states = rows;
      while (states.some((r) => r.state !== 'completed') && Date.now() < deadline) {
        await sleep(100);
        states = (await admin.query<{ state: string; attempt: number }>(`SELECT state, attempt FROM "${schema}".jobs ORDER BY created_at`)).rows;
      }
      assert.deepEqual(states.map((r) => r.state), ['completed', 'completed'], 'both jobs completed');
      assert.ok(errors.some((e) => e instanceof StalledConnectionError), 'the worker reported the stalled connection');
    } finally {
      await worker.stop({ timeout: '2s' });
      await stalled.close({ timeout: '2s' });
      await admin.query(`DROP SCHEMA "${schema}" CASCADE`);
      await direct.close();
    }
  });
});
