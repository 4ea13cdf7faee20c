import type { NamedQuery } from '../storage/driver.ts';
import { namedQueries } from '../storage/named.ts';
import { BEHIND_IN_BATCH, lockOrderingKeys, orderingValues } from '../jobs/ordering-sql.ts';

/** Statements of the internal fan-out (events into the jobs of consumer groups), for one quoted schema. */
export interface FanOutQueries {
  lockKeys: NamedQuery;
  fanOut: NamedQuery;
}

/**
 * The job id of an event in a group, from the event id and `md5(group || '/' || event id)`
 * (given as `digest`, computed once per row): the event id's time bits (48),
 * then version 8 and bits of the digest. The same pair always gets the same
 * id, so a replayed fan-out inserts nothing (ON CONFLICT), and ids still sort
 * by event time.
 */
export const FANOUT_JOB_ID = (eventId: string, digest: string) =>
  `(substr(${eventId}::text, 1, 13) || '-8' || substr(${digest}, 1, 3) || '-8' || substr(${digest}, 4, 3) || '-' || substr(${digest}, 7, 12))::uuid`;

/**
 * The consumer groups an event `e` (with `type` and `xid`) goes to, `$group` restricting them to one:
 * those whose types include it and whose start snapshot did not already see the event, not a
 * group reading from a broker.
 */
const GROUPS_OF_EVENT = (groups: string, group: string) => `${groups} AS g
           ON e.type = ANY(g.types)
          AND g.source IS NULL
          AND (${group}::text IS NULL OR g.name = ${group}::text)
          AND (g.start_snapshot IS NULL OR NOT pg_visible_in_snapshot(e.xid::xid8, g.start_snapshot))`;

/** Builds the fan-out statements for a quoted schema name. */
export function fanOutQueries(quotedSchema: string): FanOutQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    // $1 types, $2 xids, $3 keys, $4 only this group (null: every group). The lock of every
    // (group queue, key) the fan-out will insert a job of: the keys' ordering_keys rows, upserted
    // sorted by queue and key (the order the release locks them in), held until the transaction
    // ends. Run before `fanOut`, in a statement of its own, so that the insert's snapshot sees
    // every job of those keys committed before the locks were granted (migration 18).
    lockKeys: q(
      'fanout_lock_keys',
      lockOrderingKeys(
        s,
        `SELECT DISTINCT g.queue, e.subject
           FROM unnest($1::text[], $2::text[], $3::text[]) AS e(type, xid, subject)
           JOIN ${GROUPS_OF_EVENT(`${s}.consumer_groups`, '$4')}
          WHERE e.subject IS NOT NULL`,
      ),
    ),
    // $1 event ids, $2 types, $3 xids, $4 keys, $5 correlation ids, $6 envelopes (json text),
    // $7 only this group (null: every group). One job per (event, group of GROUPS_OF_EVENT), in
    // event order. The key is the job's ordering key, and the statement does the acquire trigger's
    // work itself, set-wise, with the keys locked by `lockKeys` (ordering-sql.ts, migration 18): a
    // keyed job gets the next ordering_seq in event order, and is blocked when an earlier job of
    // its key in this batch, or a stored one that keeps the key, comes before it. A keyed job
    // already stored (a backfill overlapping the relay) is left out before that count, so that
    // nothing queues behind a job this statement does not insert.
    // The envelope is parsed and the id's digest computed once per row: `OFFSET 0` keeps each
    // lateral subquery from being pulled up into the select list, where PostgreSQL evaluated the
    // parse twice (payload, traceparent) and the digest three times (20 % of the statement's time
    // over 2,000 events). The probe by id is a scalar subquery with LIMIT, which cannot become a
    // join that reads the whole table on statistics taken while it was small.
    fanOut: q(
      'fanout',
      `INSERT INTO ${s}.jobs (id, queue, type, state, max_attempts, correlation_id, expires_at, payload, ordering_key, traceparent, ordering_seq, blocked)
       SELECT c.id, c.queue, c.type, 'available', c.max_attempts, c.correlation_id, c.expires_at, d.doc, c.key, d.doc->>'traceparent',
              ${orderingValues(s, 'c')}
         FROM (SELECT x.*, ${BEHIND_IN_BATCH('x.queue', 'x.key', 'x.ord')} AS behind
                 FROM (SELECT ${FANOUT_JOB_ID('e.id', 'h.digest')} AS id, g.queue, g.name, e.type, e.subject AS key, e.correlation_id, e.envelope, e.ord,
                              g.max_attempts, now() + g.max_age_ms * interval '1 millisecond' AS expires_at
                         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
                              WITH ORDINALITY AS e(id, type, xid, subject, correlation_id, envelope, ord)
                         JOIN ${GROUPS_OF_EVENT(`${s}.consumer_groups`, '$7')}
                        CROSS JOIN LATERAL (SELECT md5(g.name || '/' || e.id::text) AS digest OFFSET 0) AS h) AS x
                WHERE x.key IS NULL OR (SELECT true FROM ${s}.jobs AS j WHERE j.id = x.id LIMIT 1) IS NULL) AS c
        CROSS JOIN LATERAL (SELECT c.envelope::jsonb AS doc OFFSET 0) AS d
        ORDER BY c.ord, c.name
       ON CONFLICT (id) DO NOTHING
       RETURNING id`,
    ),
  };
}
