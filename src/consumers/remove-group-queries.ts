import type { NamedQuery } from '../storage/driver.ts';
import { CANCEL_SET } from '../jobs/admin-queries.ts';
import { WAITING } from '../jobs/queries.ts';
import { namedQueries } from '../storage/named.ts';

/** Statements that remove a consumer group, for one quoted schema. Every value is a bind parameter. */
export interface RemoveGroupQueries {
  lockInternalCursor: NamedQuery;
  runningJobs: NamedQuery;
  deleteGroup: NamedQuery;
  cancelLeftJobs: NamedQuery;
  deleteInboxKeys: NamedQuery;
}

/** Builds the group-removal statements for a quoted schema name. */
export function removeGroupQueries(quotedSchema: string): RemoveGroupQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    // $1 internal target. Waits for a fan-out in flight (its round holds the row) and holds the next
    // one off until the removal commits: no fan-out that saw the group commits after it is gone.
    lockInternalCursor: q('group_remove_lock_cursor', `SELECT 1 FROM ${s}.relay_cursors WHERE target = $1 FOR SHARE`),
    // $1 queue. Jobs a live worker runs (lease not expired): a consumer of the group still runs.
    runningJobs: q('group_remove_running', `SELECT count(*)::int AS n FROM ${s}.jobs WHERE state = 'active' AND locked_until > now() AND queue = $1`),
    // $1 name
    deleteGroup: q('group_remove', `DELETE FROM ${s}.consumer_groups WHERE name = $1 RETURNING queue`),
    // $1 queue, $2 batch. Its jobs nobody will run any more: waiting (blocked or not), and active
    // under an expired lease. Each batch by primary key, found through the indexes holding them.
    cancelLeftJobs: q(
      'group_remove_cancel',
      `UPDATE ${s}.jobs SET ${CANCEL_SET} WHERE id = ANY (ARRAY(
         SELECT id FROM ${s}.jobs WHERE queue = $1 AND state IN ${WAITING} AND NOT blocked
         UNION ALL
         SELECT id FROM ${s}.jobs WHERE queue = $1 AND state IN ${WAITING} AND blocked AND ordering_key IS NOT NULL
         UNION ALL
         SELECT id FROM ${s}.jobs WHERE state = 'active' AND locked_until <= now() AND queue = $1
         LIMIT $2))
         AND state IN ('scheduled', 'available', 'retrying', 'active') AND (state <> 'active' OR locked_until <= now())`,
    ),
    // $1 group, $2 batch
    deleteInboxKeys: q(
      'group_remove_inbox',
      `DELETE FROM ${s}.inbox WHERE consumer_group = $1 AND event_id = ANY (ARRAY(
         SELECT event_id FROM ${s}.inbox WHERE consumer_group = $1 LIMIT $2))`,
    ),
  };
}
