/**
 * SQL of the history checker's records, for one quoted schema: the `h_runs`
 * and `h_effects` tables the reliability handlers write, and the reads that
 * give the checker the complete history (with mailroom's own fencing data:
 * `jobs` and `job_errors`).
 */
import type { NamedQuery } from '../../src/storage/driver.ts';
import { namedQueries } from '../../src/storage/named.ts';

export interface HistoryQueries {
  /** Creates `h_runs` and `h_effects` (no unique keys: a duplicate must be visible). */
  createTables: string;
  /** $1 run id, $2 destination, $3 op id, $4 job id, $5 attempt, $6 pid. Autocommit, on its own connection. */
  recordRun: NamedQuery;
  /** $1 run id, $2 destination, $3 op id, $4 key, $5 seq, $6 job id, $7 attempt, $8 pid. Through `ctx.tx`. */
  recordEffect: NamedQuery;
  readRuns: NamedQuery;
  readEffects: NamedQuery;
  /** Fencing data: every job of the schema's queues that a handler recorded. */
  readJobs: NamedQuery;
  readLeaseExpired: NamedQuery;
}

/** The history statements for a quoted schema name (`"s"`). */
export function historyQueries(quotedSchema: string): HistoryQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    createTables: `
      CREATE TABLE ${s}.h_runs (id uuid NOT NULL, dest text NOT NULL, op text NOT NULL, job_id uuid NOT NULL,
        attempt int NOT NULL, pid int NOT NULL, started_at timestamptz NOT NULL DEFAULT clock_timestamp());
      CREATE TABLE ${s}.h_effects (id bigserial PRIMARY KEY, run_id uuid NOT NULL, dest text NOT NULL, op text NOT NULL,
        key text, seq int, job_id uuid NOT NULL, attempt int NOT NULL, pid int NOT NULL,
        at timestamptz NOT NULL DEFAULT clock_timestamp());`,
    recordRun: q('h_record_run', `INSERT INTO ${s}.h_runs (id, dest, op, job_id, attempt, pid) VALUES ($1, $2, $3, $4, $5, $6)`),
    recordEffect: q(
      'h_record_effect',
      `INSERT INTO ${s}.h_effects (run_id, dest, op, key, seq, job_id, attempt, pid) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
    ),
    readRuns: q('h_read_runs', `SELECT id, dest, op, job_id, attempt, pid FROM ${s}.h_runs ORDER BY started_at, id`),
    readEffects: q('h_read_effects', `SELECT id::int AS id, run_id, dest, op, key, seq, job_id, attempt, pid FROM ${s}.h_effects ORDER BY id`),
    readJobs: q(
      'h_read_jobs',
      `SELECT j.id, j.queue, j.state, j.attempt, j.claim_count FROM ${s}.jobs AS j
        WHERE j.id IN (SELECT job_id FROM ${s}.h_runs UNION SELECT job_id FROM ${s}.h_effects)`,
    ),
    readLeaseExpired: q('h_read_lease_expired', `SELECT job_id, claim, attempt FROM ${s}.job_errors WHERE category = 'lease-expired'`),
  };
}
