import type { NamedQuery } from '../storage/driver.ts';
import { namedQueries } from '../storage/named.ts';

/**
 * Statements of `mailroom.parkedEvents`: reading, republishing and discarding
 * the events relay targets refused for good (`relay_parked`). For one quoted
 * schema; every value is a bind parameter.
 */
export interface ParkedQueries {
  list: NamedQuery;
  next: NamedQuery;
  remove: NamedQuery;
  refusedAgain: NamedQuery;
  discard: NamedQuery;
}

/** Builds the parked-event statements for a quoted schema name. */
export function parkedQueries(quotedSchema: string): ParkedQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    // $1 target or null, $2 limit. Oldest first per target; the envelope's size, not the envelope.
    list: q(
      'parked_list',
      `SELECT target, position::text AS position, event_id, type, reason, holder, parked_at, octet_length(body)::int AS bytes
         FROM ${s}.relay_parked WHERE ($1::text IS NULL OR target = $1)
        ORDER BY target, position LIMIT $2`,
    ),
    // $1 target, $2 event ids or null (all), $3 the position after which to look. The next one to republish.
    next: q(
      'parked_next',
      `SELECT position::text AS position, xid::text AS xid, event_id, body FROM ${s}.relay_parked
        WHERE target = $1 AND ($2::text[] IS NULL OR event_id = ANY($2)) AND position > $3::bigint
        ORDER BY position LIMIT 1`,
    ),
    // $1 target, $2 position. Republished: the row goes.
    remove: q('parked_remove', `DELETE FROM ${s}.relay_parked WHERE target = $1 AND position = $2::bigint`),
    // $1 target, $2 position, $3 reason. Refused again: the row stays with the target's latest reason.
    refusedAgain: q('parked_refused_again', `UPDATE ${s}.relay_parked SET reason = $3 WHERE target = $1 AND position = $2::bigint`),
    // $1 target, $2 event ids or null (all).
    discard: q(
      'parked_discard',
      `DELETE FROM ${s}.relay_parked WHERE target = $1 AND ($2::text[] IS NULL OR event_id = ANY($2)) RETURNING event_id`,
    ),
  };
}
