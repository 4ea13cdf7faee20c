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
import { PgDriver } from '../src/storage/pg-driver.ts';
import { databaseUrl } from './helpers/databases.ts';
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
});
