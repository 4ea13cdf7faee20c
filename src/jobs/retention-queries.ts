import type { NamedQuery } from '../storage/driver.ts';
import { namedQueries } from '../storage/named.ts';

/** Statements of retention, each deleting at most one bounded batch, for one quoted schema. */
export interface RetentionQueries {
  pruneByAge: NamedQuery;
  pruneCompletedByCount: NamedQuery;
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
    // $1 completed jobs to keep per queue (newest first), $2 batch
    pruneCompletedByCount: q(
      'prune_by_count',
      `DELETE FROM ${s}.jobs WHERE id = ANY (ARRAY(
         SELECT id FROM (
           SELECT id, row_number() OVER (PARTITION BY queue ORDER BY finished_at DESC) AS rn
             FROM ${s}.jobs WHERE state = 'completed') AS ranked
          WHERE rn > $1 LIMIT $2))`,
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
