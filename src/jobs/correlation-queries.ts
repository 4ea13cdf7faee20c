import type { NamedQuery } from '../storage/driver.ts';
import { namedQueries } from '../storage/named.ts';

/** Statements behind `jobs.byCorrelation`, for one quoted schema. */
export interface CorrelationQueries {
  jobs: NamedQuery;
  events: NamedQuery;
}

/** Builds the correlation statements for a quoted schema name. */
export function correlationQueries(quotedSchema: string): CorrelationQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    // $1 correlation id, $2 limit. Every job of any queue with that correlation id, oldest first
    // (jobs_correlation_idx). A job in a consumer group's queue was made from an event (the fan-out
    // and broker ingest copy the event's correlation id onto it): its payload is the event's
    // envelope, so the event id is payload->>'id' (NULL for a payload that is not an object).
    jobs: q(
      'correlation_jobs',
      `SELECT j.id, j.type, j.queue, j.state, j.run_at, j.attempt, j.max_attempts, j.blocked, j.ordering_key,
              j.created_at, j.finished_at, j.dead_reason, j.last_error, g.name AS consumer_group,
              CASE WHEN g.name IS NOT NULL AND jsonb_typeof(j.payload) = 'object' THEN j.payload->>'id' END AS event_id
         FROM ${s}.jobs AS j
         LEFT JOIN LATERAL (SELECT cg.name FROM ${s}.consumer_groups AS cg WHERE cg.queue = j.queue ORDER BY cg.name LIMIT 1) AS g ON true
        WHERE j.correlation_id = $1
        ORDER BY j.created_at, j.id
        LIMIT $2`,
    ),
    // $1 correlation id, $2 limit. Every outbox event with that correlation id, in the order they
    // were written (outbox_correlation_idx), with the relay targets whose cursor has passed it and
    // those it still waits for. A cursor is the (xid, position) of the last row its target got, in
    // the relay's commit-safe order (see relay-queries.ts): a row at or below it was delivered.
    events: q(
      'correlation_events',
      `SELECT o.id, o.type, o.subject, o.time, o.created_at, o.causation_id,
              ARRAY(SELECT c.target FROM ${s}.relay_cursors AS c
                     WHERE (o.xid, o.position) <= (c.cursor_xid, c.cursor_position) ORDER BY c.target) AS published_to,
              ARRAY(SELECT c.target FROM ${s}.relay_cursors AS c
                     WHERE (o.xid, o.position) > (c.cursor_xid, c.cursor_position) ORDER BY c.target) AS pending_to
         FROM ${s}.outbox AS o
        WHERE o.correlation_id = $1
        ORDER BY o.created_at, o.position
        LIMIT $2`,
    ),
  };
}
