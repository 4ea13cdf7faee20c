import type { NamedQuery } from '../storage/driver.ts';
import { namedQueries } from '../storage/named.ts';

/** Statements of the internal fan-out (events into the jobs of consumer groups), for one quoted schema. */
export interface FanOutQueries {
  fanOut: NamedQuery;
}

/**
 * The job id of an event in a group: the event id's time bits (48), then
 * version 8 and bits of md5(group, event id). The same pair always gets the
 * same id, so a replayed fan-out inserts nothing (ON CONFLICT), and ids still
 * sort by event time.
 */
export const FANOUT_JOB_ID = (group: string, eventId: string) =>
  `(substr(${eventId}::text, 1, 13) || '-8' || substr(md5(${group} || '/' || ${eventId}::text), 1, 3) || '-8'
      || substr(md5(${group} || '/' || ${eventId}::text), 4, 3) || '-' || substr(md5(${group} || '/' || ${eventId}::text), 7, 12))::uuid`;

/** Builds the fan-out statements for a quoted schema name. */
export function fanOutQueries(quotedSchema: string): FanOutQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    // $1 event ids, $2 types, $3 xids, $4 keys, $5 correlation ids, $6 envelopes (json text),
    // $7 only this group (null: every group). One job per (event, group whose types include it and
    // whose start snapshot did not already see the event; not a group reading from a broker), in event order, so that the ordering
    // trigger queues jobs of one key in event order. The key is the job's ordering key.
    fanOut: q(
      'fanout',
      `INSERT INTO ${s}.jobs (id, queue, type, state, max_attempts, correlation_id, expires_at, payload, ordering_key, traceparent)
       SELECT ${FANOUT_JOB_ID('g.name', 'e.id')}, g.queue, e.type, 'available', g.max_attempts, e.correlation_id,
              now() + g.max_age_ms * interval '1 millisecond', d.doc, e.subject, d.doc->>'traceparent'
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
              WITH ORDINALITY AS e(id, type, xid, subject, correlation_id, envelope, ord)
        CROSS JOIN LATERAL (SELECT e.envelope::jsonb AS doc) AS d
         JOIN ${s}.consumer_groups AS g
           ON e.type = ANY(g.types)
          AND g.source IS NULL
          AND ($7::text IS NULL OR g.name = $7::text)
          AND (g.start_snapshot IS NULL OR NOT pg_visible_in_snapshot(e.xid::xid8, g.start_snapshot))
        ORDER BY e.ord, g.name
       ON CONFLICT (id) DO NOTHING
       RETURNING id`,
    ),
  };
}
