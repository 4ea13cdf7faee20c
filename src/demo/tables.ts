/**
 * The demo's own tables, in the demo's schema beside mailroom's: which jobs it
 * enqueued (written in the same transaction as the jobs, and counting the
 * handler's effect, written through ctx.tx) and every run a handler started.
 * The ledger is computed from these and mailroom's tables.
 */
import { randomBytes } from 'node:crypto';
import { quoteSchema } from '../identifiers.ts';
import type { Job, JobContext } from '../worker/types.ts';
import type { RecordRun } from './workload.ts';

/** Runs one statement and returns its rows. */
export type Query = <R = Record<string, unknown>>(sql: string, params?: unknown[]) => Promise<R[]>;

/** A fresh schema name per run, `demo_<date>_<time>_<random>`, so reruns never mix. */
export function demoSchemaName(now: Date = new Date()): string {
  const stamp = now.toISOString().replace(/[-:]/g, '').replace('T', '_').slice(0, 15);
  return `demo_${stamp}_${randomBytes(2).toString('hex')}`;
}

/** Creates `demo_jobs` and `demo_runs` in the (already migrated) schema. */
export async function createDemoTables(query: Query, schema: string): Promise<void> {
  const s = quoteSchema(schema);
  // effects: the handler's business write, made through ctx.tx so it commits with the job's completion.
  await query(
    `CREATE TABLE ${s}.demo_jobs (job_id uuid PRIMARY KEY, kind text NOT NULL, effects integer NOT NULL DEFAULT 0,
       enqueued_at timestamptz NOT NULL DEFAULT now())`,
  );
  await query(
    `CREATE TABLE ${s}.demo_runs (job_id uuid NOT NULL, attempt integer NOT NULL, worker_id text NOT NULL,
       started_at timestamptz NOT NULL DEFAULT clock_timestamp())`,
  );
  await query(`CREATE INDEX demo_runs_job_idx ON ${s}.demo_runs (job_id)`);
}

/** True when the schema exists and already has jobs (a `--schema` the demo must not reuse). */
export async function schemaHasJobs(query: Query, schema: string): Promise<boolean> {
  const rows = await query<{ present: boolean }>(
    `SELECT EXISTS (SELECT 1 FROM information_schema.tables WHERE table_schema = $1 AND table_name IN ('jobs', 'demo_jobs')) AS present`,
    [schema],
  );
  return rows[0]?.present === true;
}

/** Writes one row to `demo_runs` per handler run, stamped with the database's clock when the run starts. */
export function runRecorder(query: Query, schema: string): RecordRun {
  const sql = `INSERT INTO ${quoteSchema(schema)}.demo_runs (job_id, attempt, worker_id) VALUES ($1, $2, $3)`;
  return async (job: Job, ctx: JobContext) => {
    await query(sql, [job.id, job.attempt, ctx.workerId]);
  };
}

/** The SQL of a handler's effect: one more on its demo_jobs row (run through ctx.tx, so at most once per job). */
export function effectSql(schema: string): string {
  return `UPDATE ${quoteSchema(schema)}.demo_jobs SET effects = effects + 1 WHERE job_id = $1`;
}
