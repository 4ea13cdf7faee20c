/**
 * The LISTEN connection of the PostgreSQL driver (src/storage/pg-driver.ts)
 * is asked a `SELECT 1` every so often: one cut off without a reset (a
 * partition that dropped its state; here a TCP proxy that stalls the
 * connections open at that moment, test/reliability/fault-proxy.ts) would
 * otherwise look alive for good, and no NOTIFY would reach the workers and
 * relays of the process again. Once it does not answer in time it is replaced,
 * and notifications arrive again; a stop does not wait on it either.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import pg from 'pg';
import { createMailroom } from '../src/index.ts';
import type { RelayTarget } from '../src/index.ts';
import { PgDriver } from '../src/storage/pg-driver.ts';
import { databaseUrl, uniqueSchema } from './helpers/databases.ts';
import { FaultProxy } from './reliability/fault-proxy.ts';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('the LISTEN connection is checked (PostgreSQL)', { skip: databaseUrl ? false : 'set TEST_DATABASE_URL' }, () => {
  it('a LISTEN connection stalled without a reset is replaced, and notifications arrive again; close() does not wait on it', async () => {
    const server = new URL(databaseUrl!);
    const proxy = await FaultProxy.start({ host: server.hostname, port: Number(server.port || 5432) });
    const through = new URL(databaseUrl!);
    through.hostname = '127.0.0.1';
    through.port = String(proxy.port);
    const driver = new PgDriver(new pg.Pool({ connectionString: through.toString(), max: 3 }), true, { everyMs: 200, answerMs: 300 });
    const admin = new pg.Client({ connectionString: databaseUrl });
    await admin.connect();
    const channel = `listen_check_${process.pid}`;
    const received: string[] = [];
    try {
      await driver.listen(channel, (payload) => void received.push(payload));
      /** Notifies `payload` until it arrives (a NOTIFY is only a hint: one sent while reconnecting is lost), within `ms`. */
      const arrives = async (payload: string, ms: number): Promise<boolean> => {
        const deadline = Date.now() + ms;
        while (Date.now() < deadline) {
          await admin.query('SELECT pg_notify($1, $2)', [channel, payload]);
          await sleep(100);
          if (received.includes(payload)) return true;
        }
        return false;
      };
      assert.ok(await arrives('before', 5000), 'a notification arrives through the proxy');
      assert.ok(proxy.stallOpen() >= 1, 'the LISTEN connection was open through the proxy');
      await admin.query('SELECT pg_notify($1, $2)', [channel, 'while-stalled']);
      await sleep(50);
      assert.ok(!received.includes('while-stalled'), 'the stalled connection delivers nothing');
      // Checked every 200 ms, given up after 300 ms without an answer, connected again a second later.
      assert.ok(await arrives('after', 10_000), `notifications arrive again once the stalled LISTEN connection is replaced (received: ${received.join(', ')})`);
      const began = Date.now();
      proxy.stallOpen(); // the new LISTEN connection too: close() must still end
      await driver.close();
      assert.ok(Date.now() - began < 5000, `close() took ${Date.now() - began} ms with its LISTEN connection stalled`);
    } finally {
      await admin.end();
      await proxy.close();
    }
  });

  for (const first of ['worker', 'relay'] as const) {
    it(`a ${first}'s stop does not wait for its UNLISTEN on a stalled LISTEN connection that another listener still uses`, { timeout: 60_000 }, async () => {
      const server = new URL(databaseUrl!);
      const proxy = await FaultProxy.start({ host: server.hostname, port: Number(server.port || 5432) });
      const through = new URL(databaseUrl!);
      through.hostname = '127.0.0.1';
      through.port = String(proxy.port);
      // Idle connections close at once, so that only the LISTEN connection (checked out for good) is open to stall.
      const pool = new pg.Pool({ connectionString: through.toString(), max: 4, idleTimeoutMillis: 100 });
      const schema = uniqueSchema('unlisten');
      const mailroom = await createMailroom({ database: pool, schema });
      const errors: unknown[] = [];
      mailroom.on('error', ({ error }) => void errors.push(error));
      try {
        await mailroom.migrate();
        const sink: RelayTarget = { name: 'sink', publish: async () => {} };
        // The worker's and the relay's channels differ: the first to stop sends `UNLISTEN <its channel>`, the other goes on listening.
        const worker = mailroom.worker({ queues: ['quiet'], handlers: {}, maintenance: false, pollInterval: '1m' });
        const relay = mailroom.relay({ to: [sink], internal: false, pollInterval: '1m' });
        await worker.start();
        await relay.start();
        const deadline = Date.now() + 15_000;
        while (!(pool.totalCount === 1 && pool.idleCount === 0 && proxy.stats().open === 1)) {
          assert.ok(Date.now() < deadline, `only the LISTEN connection open within 15 s (pool ${pool.totalCount}, idle ${pool.idleCount}; proxy ${proxy.stats().open})`);
          await sleep(20);
        }
        assert.equal(proxy.stallOpen(), 1, 'one connection stalled: the LISTEN connection');
        const [stopping, staying] = first === 'worker' ? [worker, relay] : [relay, worker];
        const began = Date.now();
        await stopping.stop({ timeout: '1s' });
        const waited = Date.now() - began;
        // The UNLISTEN waits a second at most (the LISTEN check, every 30 s by default, would replace the connection much later).
        assert.ok(waited >= 900 && waited < 3000, `stop() took ${waited} ms with its UNLISTEN on a stalled connection`);
        assert.deepEqual(errors.map((e) => (e instanceof Error ? e.message : String(e))), [], 'nothing reported');
        await staying.stop({ timeout: '1s' });
      } finally {
        await mailroom.close({ timeout: 1000 }).catch(() => {});
        const admin = new pg.Client({ connectionString: databaseUrl });
        await admin.connect();
        await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => {});
        await admin.end();
        await pool.end().catch(() => {});
        await proxy.close();
      }
    });
  }
});
