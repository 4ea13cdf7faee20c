import { packedEventColumns } from '../events/envelope-sql.ts';
import type { NamedQuery } from '../storage/driver.ts';
import { CANCEL_SET } from '../jobs/admin-queries.ts';
import { WAITING_BLOCKED, WAITING_UNBLOCKED } from '../jobs/queries.ts';
import { namedQueries } from '../storage/named.ts';

/** Statements of consumer groups and the inbox, for one quoted schema. Every value is a bind parameter. */
export interface ConsumerQueries {
  ensureInternalCursor: NamedQuery;
  lockInternalCursor: NamedQuery;
  registerGroup: NamedQuery;
  deliveredOfTypes: NamedQuery;
  inboxSeenAmong: NamedQuery;
  inboxRecord: NamedQuery;
  inboxForget: NamedQuery;
  countDuplicate: NamedQuery;
  pruneInbox: NamedQuery;
  groupStats: NamedQuery;
  runningJobs: NamedQuery;
  removeGroup: NamedQuery;
  cancelLeftJobs: NamedQuery;
  forgetGroupInbox: NamedQuery;
}

/** Builds the consumer statements for a quoted schema name. */
export function consumerQueries(quotedSchema: string): ConsumerQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    // $1 target
    ensureInternalCursor: q('consumer_ensure_cursor', `INSERT INTO ${s}.relay_cursors (target) VALUES ($1) ON CONFLICT (target) DO NOTHING`),
    // $1 target. Registering a group waits for a fan-out in flight and holds the next one off until
    // it commits: every fan-out either committed before the group's start snapshot (the group does
    // not get those events, or gets them by backfill) or sees the group.
    lockInternalCursor: q(
      'consumer_lock_cursor',
      `SELECT cursor_xid::text AS cursor_xid, cursor_position::text AS cursor_position FROM ${s}.relay_cursors WHERE target = $1 FOR SHARE`,
    ),
    // $1 name, $2 queue, $3 types, $4 from earliest, $5 max attempts, $6 max age ms, $7 inbox retention ms,
    // $8 broker source (null: internal events). A new group's start snapshot (from 'now'): events
    // committed before it are not the group's.
    registerGroup: q(
      'consumer_register',
      `INSERT INTO ${s}.consumer_groups AS g (name, queue, types, start_snapshot, max_attempts, max_age_ms, inbox_retention_ms, source)
       VALUES ($1, $2, $3::text[], CASE WHEN $4::boolean THEN NULL ELSE pg_current_snapshot() END, $5, $6, $7, $8::text)
       ON CONFLICT (name) DO UPDATE
          SET queue = EXCLUDED.queue, types = EXCLUDED.types, max_attempts = EXCLUDED.max_attempts,
              max_age_ms = EXCLUDED.max_age_ms, inbox_retention_ms = EXCLUDED.inbox_retention_ms,
              source = EXCLUDED.source, updated_at = now()
       RETURNING (xmax = 0) AS created`,
    ),
    // $1 types, $2 cursor xid, $3 cursor position, $4 after position, $5 limit: events the internal
    // target already delivered, in position order, as stored events (a new group's backfill).
    deliveredOfTypes: q(
      'consumer_delivered_of_types',
      `SELECT ${packedEventColumns('o')}
         FROM ${s}.outbox AS o
        WHERE o.type = ANY($1::text[]) AND (o.xid, o.position) <= ($2::xid8, $3::bigint) AND o.position > $4::bigint
        ORDER BY o.position LIMIT $5`,
    ),
    // $1 group, $2 event ids: those of them the group's inbox holds. One primary-key probe per id,
    // whatever the statistics say: a LATERAL subquery with LIMIT cannot become a join, which on
    // statistics taken while the inbox was small (or none yet) hashed the ids and read every key of
    // the group through inbox_received_idx (2.6 ms per lookup of 50 ids at 20,000 keys, growing with
    // the inbox; 0.13 ms probing). `event_id = ANY($2)` had done the same.
    inboxSeenAmong: q(
      'inbox_seen_among',
      `SELECT k.event_id FROM unnest($2::uuid[]) AS k(event_id)
        CROSS JOIN LATERAL (SELECT 1 FROM ${s}.inbox AS i WHERE i.consumer_group = $1 AND i.event_id = k.event_id LIMIT 1) AS seen`,
    ),
    // $1 group, $2 event id. In the handler's transaction; waits for a concurrent holder of the key.
    inboxRecord: q('inbox_record', `INSERT INTO ${s}.inbox (consumer_group, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1 AS recorded`),
    // $1 group, $2 event id. A snoozed handler's key, taken back in its transaction.
    inboxForget: q('inbox_forget', `DELETE FROM ${s}.inbox WHERE consumer_group = $1 AND event_id = $2`),
    // $1 group
    countDuplicate: q('consumer_count_duplicate', `UPDATE ${s}.consumer_groups SET duplicates_rejected = duplicates_rejected + 1 WHERE name = $1`),
    // $1 group, $2 retention ms, $3 batch. The batch's keys as an array, so that every plan deletes
    // them by primary key (as `IN (…)`, PostgreSQL read the whole inbox for each batch).
    pruneInbox: q(
      'inbox_prune',
      `DELETE FROM ${s}.inbox WHERE consumer_group = $1 AND event_id = ANY (ARRAY(
         SELECT event_id FROM ${s}.inbox
          WHERE consumer_group = $1 AND received_at < now() - $2::bigint * interval '1 millisecond'
          LIMIT $3))`,
    ),
    // $1 internal target. Per group: its unfinished jobs, events of its types the fan-out has not
    // reached yet (none for a group reading from a broker), and the duplicates its inbox rejected.
    // Unfinished jobs are counted in three parts, each through the index whose predicate it matches
    // (as in queue_counts): as one count over four states, each group read the whole jobs table.
    groupStats: q(
      'consumer_group_stats',
      `SELECT g.name, g.source, g.duplicates_rejected::float8 AS duplicates_rejected,
              ((SELECT count(*) FROM ${s}.jobs AS j WHERE j.queue = g.queue AND ${WAITING_UNBLOCKED('j')})
               + (SELECT count(*) FROM ${s}.jobs AS j WHERE j.queue = g.queue AND ${WAITING_BLOCKED('j')})
               + (SELECT count(*) FROM ${s}.jobs AS j WHERE j.queue = g.queue AND j.state = 'active'))::int AS unfinished,
              (SELECT count(*) FROM ${s}.jobs AS j WHERE j.queue = g.queue AND j.state = 'dead')::int AS dead,
              CASE WHEN g.source IS NOT NULL THEN 0 ELSE
              (SELECT count(*) FROM ${s}.outbox AS o, ${s}.relay_cursors AS c
                WHERE c.target = $1 AND o.type = ANY(g.types) AND (o.xid, o.position) > (c.cursor_xid, c.cursor_position)
                  AND (g.start_snapshot IS NULL OR NOT pg_visible_in_snapshot(o.xid, g.start_snapshot)))::int END AS unrelayed
         FROM ${s}.consumer_groups AS g ORDER BY g.name`,
    ),
    // Removing a group (remove-group.ts), in a transaction holding the internal cursor as
    // registration does (lockInternalCursor). $1 queue: jobs a live worker runs (lease not
    // expired), so a consumer of the group still runs.
    runningJobs: q('group_remove_running', `SELECT count(*)::int AS n FROM ${s}.jobs WHERE state = 'active' AND locked_until > now() AND queue = $1`),
    // $1 name
    removeGroup: q('group_remove', `DELETE FROM ${s}.consumer_groups WHERE name = $1 RETURNING queue`),
    // $1 queue, $2 batch. Its jobs nobody will run any more: waiting (blocked or not), and active
    // under an expired lease. Each batch by primary key, found through the indexes holding them.
    cancelLeftJobs: q(
      'group_remove_cancel',
      `UPDATE ${s}.jobs SET ${CANCEL_SET} WHERE id = ANY (ARRAY(
         SELECT id FROM ${s}.jobs AS j WHERE j.queue = $1 AND ${WAITING_UNBLOCKED('j')}
         UNION ALL
         SELECT id FROM ${s}.jobs AS j WHERE j.queue = $1 AND ${WAITING_BLOCKED('j')}
         UNION ALL
         SELECT id FROM ${s}.jobs WHERE state = 'active' AND locked_until <= now() AND queue = $1
         LIMIT $2))
         AND state IN ('scheduled', 'available', 'retrying', 'active') AND (state <> 'active' OR locked_until <= now())`,
    ),
    // $1 group, $2 batch. Every inbox key of the group.
    forgetGroupInbox: q(
      'group_remove_inbox',
      `DELETE FROM ${s}.inbox WHERE consumer_group = $1 AND event_id = ANY (ARRAY(
         SELECT event_id FROM ${s}.inbox WHERE consumer_group = $1 LIMIT $2))`,
    ),
  };
}
