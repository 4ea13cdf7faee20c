/**
 * Workload 5, the PostgreSQL ceiling, on the same server in the same run:
 * - pgbench: single-row INSERT commits/s with 1 client and with `concurrency`
 *   clients, and rows/s of a batched INSERT (one statement of `batch` rows);
 * - Node + pg: a batched `FOR UPDATE SKIP LOCKED` claim-and-delete loop on
 *   `loops` connections (rows/s), and the same claim keeping the rows
 *   (claim = UPDATE to 'active', then one UPDATE to 'completed' per batch), which
 *   is what a queue that keeps job history must at least do.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { createDatabase, dropDatabase } from '../db.ts';
import { now } from '../stats.ts';

const run = promisify(execFile);

export interface CeilingParams {
  serverUrl: string;
  tag: string;
  /** Seconds per pgbench run. */
  seconds: number;
  concurrency: number;
  /** Rows per batched INSERT. */
  insertBatch: number;
  /** Rows claimed per statement, and connections claiming at once. */
  claimBatch: number;
  loops: number;
  /** Rows in the table the claim loops drain. */
  rows: number;
}

export interface CeilingResult {
  pgbench: string;
  insertCommitsPerSecond1: number;
  insertCommitsPerSecondN: number;
  clientsN: number;
  batchInsertRowsPerSecond: number;
  insertBatch: number;
  claimDeleteRowsPerSecond: number;
  claimKeepRowsPerSecond: number;
  claimBatch: number;
  loops: number;
  rows: number;
}

const TABLE = `CREATE TABLE ceiling_jobs (
  id bigserial PRIMARY KEY,
  state text NOT NULL DEFAULT 'available',
  payload jsonb NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ceiling_jobs_waiting ON ceiling_jobs (id) WHERE state = 'available'`;

async function pgbench(url: URL, db: string, script: string, clients: number, seconds: number): Promise<number> {
  const args = ['-n', '-h', url.hostname, '-p', url.port || '5432', '-U', decodeURIComponent(url.username || 'postgres')];
  args.push('-c', String(clients), '-j', String(Math.min(clients, 2)), '-T', String(seconds), '-f', script, db);
  const env = { ...process.env, ...(url.password ? { PGPASSWORD: decodeURIComponent(url.password) } : {}) };
  const { stdout } = await run('pgbench', args, { env });
  const match = /tps = ([\d.]+) \(without initial connection time\)/.exec(stdout);
  if (!match) throw new Error(`pgbench: cannot read tps from its output:\n${stdout}`);
  return Number(match[1]);
}

async function fill(client: pg.Client, rows: number): Promise<void> {
  await client.query('TRUNCATE ceiling_jobs');
  await client.query(`INSERT INTO ceiling_jobs (payload) SELECT jsonb_build_object('i', g, 't', 0) FROM generate_series(1, $1::int) AS g`, [rows]);
  await client.query('VACUUM ANALYZE ceiling_jobs');
}

/** Runs `loops` connections, each calling `step` until it returns 0; returns rows/s. */
async function loopsUntilEmpty(url: string, loops: number, step: (c: pg.Client) => Promise<number>): Promise<number> {
  const clients = await Promise.all(
    Array.from({ length: loops }, async () => {
      const c = new pg.Client({ connectionString: url });
      await c.connect();
      return c;
    }),
  );
  try {
    const t0 = now();
    const counts = await Promise.all(
      clients.map(async (c) => {
        let total = 0;
        for (let n = await step(c); n > 0; n = await step(c)) total += n;
        return total;
      }),
    );
    return (counts.reduce((a, b) => a + b, 0) / (now() - t0)) * 1000;
  } finally {
    await Promise.all(clients.map((c) => c.end()));
  }
}

export async function ceiling(params: CeilingParams): Promise<CeilingResult> {
  const dbName = `${params.tag}_ceiling`;
  const url = await createDatabase(params.serverUrl, dbName);
  const dir = await mkdtemp(join(tmpdir(), 'mailroom-bench-'));
  try {
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    await admin.query(TABLE);
    const single = join(dir, 'single.sql');
    const batch = join(dir, 'batch.sql');
    await writeFile(single, `INSERT INTO ceiling_jobs (payload) VALUES ('{"i": 1, "t": 0}');\n`);
    await writeFile(batch, `INSERT INTO ceiling_jobs (payload) SELECT jsonb_build_object('i', g, 't', 0) FROM generate_series(1, ${params.insertBatch}) AS g;\n`);
    const server = new URL(url);
    const { stdout: version } = await run('pgbench', ['--version']);

    const insert1 = await pgbench(server, dbName, single, 1, params.seconds);
    const insertN = await pgbench(server, dbName, single, params.concurrency, params.seconds);
    const batchTps = await pgbench(server, dbName, batch, 1, params.seconds);

    const claim = { name: 'ceiling_claim_delete', text: `DELETE FROM ceiling_jobs WHERE id IN (
        SELECT id FROM ceiling_jobs ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING id, payload` };
    await fill(admin, params.rows);
    const claimDelete = await loopsUntilEmpty(url, params.loops, async (c) => {
      const r = await c.query({ ...claim, values: [params.claimBatch] });
      return r.rowCount ?? 0;
    });

    const claimKeep = { name: 'ceiling_claim_keep', text: `UPDATE ceiling_jobs SET state = 'active' WHERE id IN (
        SELECT id FROM ceiling_jobs WHERE state = 'available' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING id, payload` };
    const complete = { name: 'ceiling_complete', text: `UPDATE ceiling_jobs SET state = 'completed' WHERE id = ANY($1::bigint[]) AND state = 'active'` };
    await fill(admin, params.rows);
    const keep = await loopsUntilEmpty(url, params.loops, async (c) => {
      const r = await c.query<{ id: string }>({ ...claimKeep, values: [params.claimBatch] });
      if (r.rows.length > 0) await c.query({ ...complete, values: [r.rows.map((x) => x.id)] });
      return r.rows.length;
    });
    await admin.end();

    return {
      pgbench: version.trim(),
      insertCommitsPerSecond1: insert1,
      insertCommitsPerSecondN: insertN,
      clientsN: params.concurrency,
      batchInsertRowsPerSecond: batchTps * params.insertBatch,
      insertBatch: params.insertBatch,
      claimDeleteRowsPerSecond: claimDelete,
      claimKeepRowsPerSecond: keep,
      claimBatch: params.claimBatch,
      loops: params.loops,
      rows: params.rows,
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
    await dropDatabase(params.serverUrl, dbName);
  }
}
