import type { NamedQuery } from '../storage/driver.ts';
import { namedQueries } from '../storage/named.ts';
import { WAITING_BLOCKED, WAITING_UNBLOCKED } from './queries.ts';

/** Statements behind `jobs.cancel`, `jobs.retry` and `mailroom.stats()`, for one quoted schema. */
export interface AdminQueries {
  cancel: NamedQuery;
  retry: NamedQuery;
  stateOf: NamedQuery;
  retryBudgetOf: NamedQuery;
  dedupHolderOf: NamedQuery;
  queueCounts: NamedQuery;
  completedLastMinute: NamedQuery;
  failedLastMinute: NamedQuery;
  tableHealth: NamedQuery;
}

/** What `jobs.cancel` and a dead-letter discard do to a job (the ordering triggers hand its key on). */
export const CANCEL_SET = `state = 'cancelled', finished_at = now(), locked_until = NULL`;

/**
 * What `jobs.retry` and a dead-letter replay do to a job, in place (same id, history kept):
 * available now; a dead or cancelled job gets a fresh budget of attempts (`budget`, an SQL
 * expression: attempts on top of those spent) and of maxAge, and queues again behind its ordering key.
 */
export function retrySet(budget: string): string {
  return `state = 'available', run_at = now(), finished_at = NULL, dead_reason = NULL,
              max_attempts = CASE WHEN state IN ('dead', 'cancelled') THEN attempt + ${budget} ELSE max_attempts END,
              expires_at = CASE WHEN state IN ('dead', 'cancelled') THEN now() + (expires_at - created_at) ELSE expires_at END`;
}

/** The schema's name as an SQL string literal, from its quoted identifier (validated: letters, digits and _ only). */
function schemaLiteral(quotedSchema: string): string {
  return `'${quotedSchema.slice(1, -1)}'`;
}

/** Builds the admin statements for a quoted schema name. */
export function adminQueries(quotedSchema: string): AdminQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    // $1 table names. Live and dead row versions of mailroom's busiest tables, and the time since
    // their last vacuum, from PostgreSQL's statistics (approximate; all zero on PGlite).
    tableHealth: q(
      'table_health',
      `SELECT relname AS table, n_live_tup::float8 AS live, n_dead_tup::float8 AS dead,
              extract(epoch FROM now() - greatest(last_vacuum, last_autovacuum))::float8 AS since_vacuum
         FROM pg_stat_user_tables
        WHERE schemaname = ${schemaLiteral(s)} AND relname = ANY ($1::text[])`,
    ),
    // $1 id. Waiting and dead jobs can be cancelled; an active one is left to finish.
    cancel: q(
      'cancel',
      `UPDATE ${s}.jobs SET ${CANCEL_SET}
        WHERE id = $1 AND state IN ('scheduled', 'available', 'retrying', 'dead')
       RETURNING id`,
    ),
    // $1 id, $2 fresh attempt budget. A waiting job runs now; a dead or cancelled one gets a fresh
    // budget of attempts and of maxAge, and queues again (behind its ordering key, if it has one).
    retry: q(
      'retry',
      `UPDATE ${s}.jobs
          SET ${retrySet('$2::int')}
        WHERE id = $1 AND state IN ('scheduled', 'available', 'retrying', 'dead', 'cancelled')
       RETURNING id`,
    ),
    stateOf: q('state_of', `SELECT state FROM ${s}.jobs WHERE id = $1`),
    retryBudgetOf: q('retry_budget_of', `SELECT type, max_attempts FROM ${s}.jobs WHERE id = $1`),
    // $1 id: the unfinished job of the same type that holds this job's dedup key now, if any.
    dedupHolderOf: q(
      'dedup_holder_of',
      `SELECT o.id, o.state, j.dedup_key FROM ${s}.jobs AS j
         JOIN ${s}.jobs AS o ON o.type = j.type AND o.dedup_key = j.dedup_key AND o.id <> j.id
        WHERE j.id = $1 AND o.state IN ('scheduled', 'available', 'active', 'retrying')`,
    ),
    // Per queue, each count read through the index whose predicate it matches (waiting: see
    // WAITING_UNBLOCKED and WAITING_BLOCKED; active: jobs_lease_idx; dead: jobs_finished_idx), so
    // the cost follows the unfinished and dead jobs. As one scan filtered on all five states, PostgreSQL read the
    // whole table, completed history included (263 ms for 2,800 such jobs beside 2,000,000 completed).
    queueCounts: q(
      'queue_counts',
      `SELECT queue, sum(available)::int AS available, sum(scheduled)::int AS scheduled, sum(retrying)::int AS retrying,
              sum(blocked)::int AS blocked, sum(active)::int AS active, sum(dead)::int AS dead,
              COALESCE(extract(epoch FROM now() - min(oldest)), 0)::float8 AS oldest_age_seconds
         FROM (
           SELECT queue, count(*) FILTER (WHERE run_at <= now()) AS available,
                  count(*) FILTER (WHERE state = 'scheduled' AND run_at > now()) AS scheduled,
                  count(*) FILTER (WHERE state = 'retrying' AND run_at > now()) AS retrying,
                  0 AS blocked, 0 AS active, 0 AS dead, min(run_at) FILTER (WHERE run_at <= now()) AS oldest
             FROM ${s}.jobs AS j WHERE ${WAITING_UNBLOCKED('j')} GROUP BY queue
           UNION ALL
           SELECT queue, 0, 0, 0, count(*), 0, 0, NULL FROM ${s}.jobs AS j WHERE ${WAITING_BLOCKED('j')} GROUP BY queue
           UNION ALL
           SELECT queue, 0, 0, 0, 0, count(*), 0, NULL FROM ${s}.jobs WHERE state = 'active' GROUP BY queue
           UNION ALL
           SELECT queue, 0, 0, 0, 0, 0, count(*), NULL FROM ${s}.jobs WHERE state = 'dead' GROUP BY queue
         ) AS parts
        GROUP BY queue`,
    ),
    completedLastMinute: q(
      'completed_last_minute',
      `SELECT queue, count(*)::int AS n FROM ${s}.jobs
        WHERE state = 'completed' AND finished_at > now() - interval '60 seconds' GROUP BY queue`,
    ),
    failedLastMinute: q(
      'failed_last_minute',
      `SELECT j.queue, count(*)::int AS n FROM ${s}.job_errors AS e JOIN ${s}.jobs AS j ON j.id = e.job_id
        WHERE e.failed_at > now() - interval '60 seconds' GROUP BY j.queue`,
    ),
  };
}
