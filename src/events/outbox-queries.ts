import type { NamedQuery } from '../storage/driver.ts';
import { namedQueries } from '../storage/named.ts';

/** Statements that write and prune the outbox, for one quoted schema. Every value is a bind parameter. */
export interface OutboxQueries {
  insert: NamedQuery;
  insertInTransaction: NamedQuery;
  insertKeyed: NamedQuery;
  currentXid: NamedQuery;
  prune: NamedQuery;
  pruneKeys: NamedQuery;
  pruneParked: NamedQuery;
}

// $1 ids, $2 type, $3 version, $4 source, $5 time, $6 correlation id, $7 causation id, $8 traceparent,
// $9 headers (json text), $10 keys, $11 payloads (json text). Rows are inserted in array order, so a
// batch's positions follow it. For a batch without keys: each row takes its position here (nextval is
// volatile: it runs after the sort), and the trigger skips it (migration 19). A keyed row inserted here
// (a single keyed event) takes its position in the trigger, after its key's lock; a batch of several
// with keys goes through `insertKeyed`.
const INSERT_SELECT = (s: string) => `INSERT INTO ${s}.outbox (position, id, type, version, source, subject, time, correlation_id, causation_id, traceparent, headers, data)
       SELECT CASE WHEN u.subject IS NULL THEN nextval('${s}.outbox_position_seq') END,
              u.id, $2, $3, $4, u.subject, $5::timestamptz, $6, $7, $8, $9::jsonb, u.data::jsonb
         FROM unnest($1::uuid[], $10::text[], $11::text[]) WITH ORDINALITY AS u(id, subject, data, ord)`;

/** Builds the outbox statements for a quoted schema name (see `quoteSchema`). */
export function outboxQueries(quotedSchema: string): OutboxQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    insert: q('outbox_insert', `${INSERT_SELECT(s)} ORDER BY u.ord RETURNING id`),
    // The caller's transaction: $12 is the xid its previous statement saw. In autocommit (a client
    // whose transaction already ended) every statement is a transaction of its own, with a new xid:
    // then nothing is inserted and publish refuses.
    insertInTransaction: q('outbox_insert_tx', `${INSERT_SELECT(s)} WHERE pg_current_xact_id() = $12::xid8 ORDER BY u.ord RETURNING id`),
    // The same parameters, and $12 the xid the caller's transaction had (null on the pool): a batch
    // with keys, its keys locked and each row's previous row recorded set-wise (migration 20). The
    // function returns nothing when $12 is not the current xid (autocommit), and publish refuses.
    insertKeyed: q(
      'outbox_insert_keyed',
      `SELECT k.id FROM ${s}.outbox_publish_keyed($1::uuid[], $2, $3, $4, $5::timestamptz, $6, $7, $8, $9::jsonb, $10::text[], $11::text[], $12::xid8) AS k(id)`,
    ),
    currentXid: q('outbox_current_xid', `SELECT pg_current_xact_id()::text AS xid`),
    // $1 retention ms, $2 batch. Only rows every relay target has passed (in (xid, position) order).
    // The batch's positions as an array, so that every plan deletes them by primary key (as
    // `IN (…)`, the generic plan read the whole outbox for each batch).
    prune: q(
      'outbox_prune',
      `DELETE FROM ${s}.outbox WHERE position = ANY (ARRAY(
         SELECT o.position FROM ${s}.outbox AS o
          WHERE o.created_at < now() - $1::bigint * interval '1 millisecond'
            AND NOT EXISTS (SELECT 1 FROM ${s}.relay_cursors AS c WHERE (o.xid, o.position) > (c.cursor_xid, c.cursor_position))
          ORDER BY o.created_at
          LIMIT $2))`,
    ),
    // $1 retention ms, $2 batch. Parked events (refused for good by a target) kept past their retention.
    pruneParked: q(
      'outbox_prune_parked',
      `DELETE FROM ${s}.relay_parked WHERE ctid = ANY (ARRAY(
         SELECT ctid FROM ${s}.relay_parked WHERE parked_at < now() - $1::bigint * interval '1 millisecond' LIMIT $2))`,
    ),
    // $1 batch. Key rows untouched for an hour. A publisher holding one makes the delete wait and
    // then find it touched (ON CONFLICT re-checks), or re-creates it: order is kept either way.
    // The batch's keys as an array, deleted by primary key in every plan.
    pruneKeys: q(
      'outbox_prune_keys',
      `DELETE FROM ${s}.outbox_keys WHERE key = ANY (ARRAY(
         SELECT key FROM ${s}.outbox_keys WHERE touched_at < now() - interval '1 hour' LIMIT $1))
         AND touched_at < now() - interval '1 hour'`,
    ),
  };
}
