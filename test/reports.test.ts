/**
 * Reports (stats, dead-letter counts and batches) run with JIT compilation
 * off on PostgreSQL, set with BEGIN; other statements keep the server's
 * setting. PostgreSQL priced their per-row subqueries high enough to compile
 * them, which took longer than running them (docs/BENCHMARKS.md, session 11).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import pg from 'pg';
import { PgDriver } from '../src/storage/pg-driver.ts';
import { runReport } from '../src/storage/report-query.ts';
import { databaseUrl } from './helpers/databases.ts';

const probe = { name: 'probe_settings', text: `SELECT current_setting('jit') AS jit, current_setting('idle_in_transaction_session_timeout') AS idle` };

describe('reports on PostgreSQL', { skip: databaseUrl ? false : 'set TEST_DATABASE_URL' }, () => {
  it('runReport and transaction({ jit: false }) turn JIT off for that transaction only; plain statements keep the server setting', async () => {
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 1 });
    const driver = new PgDriver(pool, true);
    try {
      const { rows: server } = await pool.query<{ jit: string }>('SHOW jit');
      const serverJit = server[0]!.jit;
      const report = await runReport<{ jit: string }>(driver, probe, []);
      assert.equal(report.rows[0]!.jit, 'off');
      const both = await driver.transaction((tx) => tx.run<{ jit: string; idle: string }>(probe, []), { jit: false, idleTimeoutMs: 5000 });
      assert.deepEqual(both.rows[0], { jit: 'off', idle: '5s' });
      // The same (single) connection afterwards: the setting did not outlive its transaction.
      const plain = await driver.run<{ jit: string }>(probe, []);
      assert.equal(plain.rows[0]!.jit, serverJit);
    } finally {
      await driver.close();
    }
  });
});
