/**
 * The demo's ledger, computed from the database: mailroom's `jobs` and
 * `job_errors` tables and the demo's `demo_jobs` (what was enqueued, written
 * in the same transactions as the jobs) and `demo_runs` (every handler run).
 */
import { quoteSchema } from '../identifiers.ts';
import type { CrashKind, CrashRecord } from './fleet.ts';
import type { Query } from './tables.ts';
import { EXPECTED_OUTCOME, type DemoKind } from './workload.ts';

/** What the demo's run looked like, from the database and the crash driver. */
export interface Ledger {
  /** True when nothing was lost, nothing ran after completion, no effect happened twice and every job ended as planned. */
  ok: boolean;
  database: { kind: 'embedded' | 'postgres'; location: string };
  schema: string;
  settings: { jobs: number; workers: number; concurrency: number; lease: string; crashesPlanned: number };
  /** Jobs committed (rows in demo_jobs). */
  enqueued: number;
  completed: number;
  retried: {
    /** Jobs that ran more than once (attempt > 1). */
    jobs: number;
    /** Attempts beyond the first, over all jobs. */
    retries: number;
  };
  /** Failed attempts by error category (job_errors). */
  failures: Record<string, number>;
  deadLettered: { total: number; byCategory: Record<string, number> };
  /** What the workload planned: completed jobs and dead letters by category. */
  expected: { completed: number; deadLettered: Record<string, number> };
  crashes: { kind: CrashKind; description: string; count: number; workers: CrashRecord[] };
  /** Jobs whose lease expired and that maintenance put back (`lease-expired` failures). */
  rescued: number;
  /** Handler runs recorded in demo_runs, and jobs run more than once (at-least-once at work). */
  runs: { total: number; jobsRunMoreThanOnce: number };
  /**
   * The handlers' effects (written through ctx.tx, committed with the completion): how many
   * were applied, jobs that got theirs twice or more (must be 0), and completed jobs without one.
   */
  effects: { applied: number; duplicated: number; missing: number };
  /** Committed jobs neither completed nor dead-lettered at the end. Must be 0. */
  lost: number;
  /** Handler runs that started after their job had completed (or under a newer attempt). Must be 0. */
  runAfterCompletion: number;
  /** Jobs that finished differently than planned (e.g. a flaky job dead-lettered). Should be 0. */
  unexpected: number;
  /** Jobs still waiting or running when the demo ended (only when it timed out or was interrupted). */
  unfinished: Record<string, number>;
  durationMs: number;
  /** Set when the run did not finish on its own. */
  stoppedEarly?: 'timeout' | 'interrupted';
}

/** The ledger's numbers that come from the database. */
export type LedgerCounts = Pick<
  Ledger,
  | 'enqueued'
  | 'completed'
  | 'retried'
  | 'failures'
  | 'deadLettered'
  | 'rescued'
  | 'runs'
  | 'effects'
  | 'lost'
  | 'runAfterCompletion'
  | 'unexpected'
  | 'unfinished'
>;

function toRecord(rows: { key: string | null; n: number }[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const row of rows) out[row.key ?? 'unknown'] = row.n;
  return out;
}

/** Reads the ledger's numbers from the demo's schema. */
export async function countLedger(query: Query, schema: string): Promise<LedgerCounts> {
  const s = quoteSchema(schema);
  const [totals] = await query<{
    enqueued: number;
    completed: number;
    dead: number;
    missing: number;
    retried_jobs: number;
    retries: number;
    effects: number;
    duplicated: number;
    no_effect: number;
  }>(
    `SELECT count(*)::int AS enqueued,
            count(*) FILTER (WHERE j.state = 'completed')::int AS completed,
            count(*) FILTER (WHERE j.state = 'dead')::int AS dead,
            count(*) FILTER (WHERE j.id IS NULL)::int AS missing,
            count(*) FILTER (WHERE j.attempt > 1)::int AS retried_jobs,
            COALESCE(sum(GREATEST(j.attempt - 1, 0)), 0)::int AS retries,
            COALESCE(sum(d.effects), 0)::int AS effects,
            count(*) FILTER (WHERE d.effects > 1)::int AS duplicated,
            count(*) FILTER (WHERE j.state = 'completed' AND d.effects = 0)::int AS no_effect
       FROM ${s}.demo_jobs d LEFT JOIN ${s}.jobs j ON j.id = d.job_id`,
  );
  const unfinishedRows = await query<{ key: string; n: number }>(
    `SELECT j.state AS key, count(*)::int AS n FROM ${s}.demo_jobs d JOIN ${s}.jobs j ON j.id = d.job_id
      WHERE j.state NOT IN ('completed', 'dead') GROUP BY j.state ORDER BY j.state`,
  );
  const deadRows = await query<{ key: string | null; n: number }>(
    `SELECT j.dead_reason AS key, count(*)::int AS n FROM ${s}.demo_jobs d JOIN ${s}.jobs j ON j.id = d.job_id
      WHERE j.state = 'dead' GROUP BY j.dead_reason ORDER BY count(*) DESC, j.dead_reason`,
  );
  const failureRows = await query<{ key: string; n: number }>(
    `SELECT category AS key, count(*)::int AS n FROM ${s}.job_errors GROUP BY category ORDER BY count(*) DESC, category`,
  );
  const [runs] = await query<{ total: number; repeated: number; after_completion: number }>(
    `WITH per_job AS (SELECT job_id, count(*) AS n FROM ${s}.demo_runs GROUP BY job_id)
     SELECT (SELECT count(*)::int FROM ${s}.demo_runs) AS total,
            (SELECT count(*)::int FROM per_job WHERE n > 1) AS repeated,
            (SELECT count(*)::int FROM ${s}.demo_runs r JOIN ${s}.jobs j ON j.id = r.job_id
              WHERE j.state = 'completed' AND (r.started_at > j.finished_at OR r.attempt > j.attempt)) AS after_completion`,
  );
  const outcomeRows = await query<{ kind: DemoKind; state: string; dead_reason: string | null; n: number }>(
    `SELECT d.kind, j.state, j.dead_reason, count(*)::int AS n FROM ${s}.demo_jobs d JOIN ${s}.jobs j ON j.id = d.job_id
      WHERE j.state IN ('completed', 'dead') GROUP BY d.kind, j.state, j.dead_reason`,
  );
  let unexpected = 0;
  for (const row of outcomeRows) {
    const want = EXPECTED_OUTCOME[row.kind];
    if (!want || want.state !== row.state || (want.deadReason ?? null) !== (row.dead_reason ?? null)) unexpected += row.n;
  }
  const failures = toRecord(failureRows);
  const t = totals!;
  const unfinished = toRecord(unfinishedRows);
  return {
    enqueued: t.enqueued,
    completed: t.completed,
    retried: { jobs: t.retried_jobs, retries: t.retries },
    failures,
    deadLettered: { total: t.dead, byCategory: toRecord(deadRows) },
    rescued: failures['lease-expired'] ?? 0,
    runs: { total: runs!.total, jobsRunMoreThanOnce: runs!.repeated },
    effects: { applied: t.effects, duplicated: t.duplicated, missing: t.no_effect },
    lost: t.missing + Object.values(unfinished).reduce((a, b) => a + b, 0),
    runAfterCompletion: runs!.after_completion,
    unexpected,
    unfinished,
  };
}

/** The outcomes the workload plans for, to set beside the counted ones. */
export function expectedOutcomes(plan: Record<DemoKind, number>): Ledger['expected'] {
  let completed = 0;
  const deadLettered: Record<string, number> = {};
  for (const [kind, count] of Object.entries(plan) as [DemoKind, number][]) {
    const want = EXPECTED_OUTCOME[kind];
    if (want.state === 'completed') completed += count;
    else deadLettered[want.deadReason!] = (deadLettered[want.deadReason!] ?? 0) + count;
  }
  return { completed, deadLettered };
}
