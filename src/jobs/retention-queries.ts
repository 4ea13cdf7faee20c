import type { NamedQuery } from '../storage/driver.ts';
import { namedQueries } from '../storage/named.ts';

/** Statements of retention, each deleting at most one bounded batch, for one quoted schema. */
export interface RetentionQueries {
  pruneByAge: NamedQuery;
  completedCutoffs: NamedQuery;
  pruneCompletedBeyond: NamedQuery;
  pruneIdleOrderingKeys: NamedQuery;
}

/** Builds the retention statements for a quoted schema name. */
export function retentionQueries(quotedSchema: string): RetentionQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    // $1 states, $2 age ms, $3 batch. Errors and step results go with their job (ON DELETE CASCADE).
    // Each batch's ids as an array, so that every plan deletes them by primary key (as `IN (…)`,
    // PostgreSQL read the whole table once more for each batch).
    pruneByAge: q(
      'prune_by_age',
      `DELETE FROM ${s}.jobs WHERE id = ANY (ARRAY(
         SELECT id FROM ${s}.jobs
          WHERE state = ANY($1::text[]) AND finished_at < now() - $2::bigint * interval '1 millisecond'
          LIMIT $3))`,
    ),
    // $1 completed jobs to keep per queue. Per queue with more, the newest completed job past them
    // (newest first by finished_at, then id), as text so no microsecond is lost: the queues from an
    // index-only scan, then per queue a backward scan of the finished index to the cutoff. A pass
    // finds them once; ranking every completed job in each batch's delete (a window over them) took
    // 1.2 s a batch of 1,000 beside 2,000,000 completed jobs.
    completedCutoffs: q(
      'prune_count_cutoffs',
      `SELECT q.queue, c.finished_at::text AS finished_at, c.id
         FROM (SELECT DISTINCT queue FROM ${s}.jobs WHERE state = 'completed') AS q
        CROSS JOIN LATERAL (
          SELECT j.finished_at, j.id FROM ${s}.jobs AS j
           WHERE j.state = 'completed' AND j.queue = q.queue
           ORDER BY j.finished_at DESC, j.id DESC OFFSET $1 LIMIT 1) AS c`,
    ),
    // $1 queues, $2 their cutoffs' finished_at, $3 their ids, $4 batch. Completed jobs at or past each
    // queue's cutoff, oldest first through the finished index, deleted by primary key.
    pruneCompletedBeyond: q(
      'prune_by_count',
      `DELETE FROM ${s}.jobs WHERE id = ANY (ARRAY(
         SELECT old.id FROM unnest($1::text[], $2::timestamptz[], $3::uuid[]) AS c(queue, finished_at, id)
          CROSS JOIN LATERAL (
            SELECT j.id FROM ${s}.jobs AS j
             WHERE j.state = 'completed' AND j.finished_at <= c.finished_at AND j.queue = c.queue
               AND (j.finished_at < c.finished_at OR j.id <= c.id)
             ORDER BY j.finished_at LIMIT $4) AS old
          LIMIT $4))`,
    ),
    // $1 batch. A key row untouched for an hour with no job holding it; re-created on next use.
    // The batch's rows by their ctid (a two-column key has no array form), so every plan deletes
    // them with a TID scan, not a join that reads the whole table; a row touched meanwhile is a new
    // version at another ctid, and stays.
    pruneIdleOrderingKeys: q(
      'prune_ordering_keys',
      `DELETE FROM ${s}.ordering_keys AS k WHERE k.ctid = ANY (ARRAY(
         SELECT o.ctid FROM ${s}.ordering_keys AS o
          WHERE o.touched_at < now() - interval '1 hour'
            AND NOT EXISTS (SELECT 1 FROM ${s}.jobs AS j
                             WHERE j.queue = o.queue AND j.ordering_key = o.key AND j.state NOT IN ('completed', 'cancelled'))
          LIMIT $1))
         AND k.touched_at < now() - interval '1 hour'`,
    ),
  };
}
