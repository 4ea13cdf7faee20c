import type { NamedQuery } from '../storage/driver.ts';
import { namedQueries } from '../storage/named.ts';
import { claimColumns } from '../jobs/queries.ts';
import { BEHIND_IN_BATCH, blockedValue, lockQueueKeys, orderingSeq } from '../jobs/ordering-sql.ts';

/**
 * What the ingest returns of each stored job: whether it was handed to the worker (`state =
 * 'active'`), and the columns a claim returns, the payload only for a handed job.
 */
const HANDED_RETURNING = `j.state = 'active' AS handed, ${claimColumns("CASE WHEN j.state = 'active' THEN j.payload END AS payload")}`;

/** Statements that store broker messages for a consumer group, for one quoted schema. Every value is a bind parameter. */
export interface IngestQueries {
  lockKeys: NamedQuery;
  storeEvents: NamedQuery;
  storeDeadLetters: NamedQuery;
}

/** Builds the ingest statements for a quoted schema name. */
export function ingestQueries(quotedSchema: string): IngestQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    // $1 keys, $2 queue. The lock of the batch's keys (ordering-sql.ts, migration 18), in a
    // statement of its own before `storeEvents`, so that its snapshot sees every job of those keys
    // committed before the locks were granted.
    lockKeys: q('ingest_lock_keys', lockQueueKeys(s, '$2', '$1')),
    // $1 job ids, $2 types, $3 keys, $4 correlation ids, $5 envelopes (json text), $6 queue,
    // $7 max attempts, $8 max age ms (null: none), $9 jobs to hand to the group's worker, $10 their
    // lease ms, $11 that worker's id. The statement does the ordering trigger's work itself,
    // set-wise, with the keys locked by `lockKeys`: a key's jobs get their ordering_seq in delivery
    // order, and are blocked behind an earlier one of the batch or a stored job that keeps the key.
    // The first $9 jobs that are not blocked are inserted already claimed by the worker (what
    // CLAIM_SET sets, for a first claim: attempt 1, its lease counted from the insert, after any wait for the keys' locks),
    // and returned with what a claim returns: the worker runs them without claiming them again
    // (see Worker.reserveHandOff). A redelivery of a stored event is
    // left out first (before it counts as an earlier job of its key, and before it reaches ON
    // CONFLICT, where it would wait for a completion of that job in flight, which waits for the
    // key's lock this transaction holds: a deadlock); one racing the first delivery conflicts on the
    // id. That check probes the primary key per message whatever the statistics say (a LATERAL
    // subquery with LIMIT cannot become a join): as `NOT EXISTS`, on statistics taken while the
    // table was small, it hashed every job of the table, completed history included, for each batch
    // (44 ms for 200 messages at 20,000 jobs, growing with the table; 7 ms probing). The envelope is
    // parsed once per row (`OFFSET 0`: pulled up into the select list, it was parsed for the payload
    // and again for traceparent).
    storeEvents: q(
      'ingest_events',
      `INSERT INTO ${s}.jobs AS j (id, queue, type, state, attempt, claim_count, locked_until, locked_by, started_at, max_attempts,
                                  correlation_id, expires_at, payload, ordering_key, traceparent, ordering_seq, blocked)
       SELECT h.id, h.queue, h.type, CASE WHEN h.handed THEN 'active' ELSE 'available' END, h.handed::int, h.handed::int,
              CASE WHEN h.handed THEN clock_timestamp() + $10::bigint * interval '1 millisecond' END,
              CASE WHEN h.handed THEN $11::text END,
              CASE WHEN h.handed THEN now() END,
              $7::int, h.correlation_id,
              now() + $8::bigint * interval '1 millisecond', d.doc, h.key, d.doc->>'traceparent',
              ${orderingSeq(s, 'h')}, h.blocked
         FROM (SELECT b.*, NOT b.blocked AND count(*) FILTER (WHERE NOT b.blocked) OVER (ORDER BY b.ord) <= $9::int AS handed
                 FROM (SELECT c.*, ${blockedValue(s, 'c')} AS blocked
                         FROM (SELECT x.*, ${BEHIND_IN_BATCH('x.queue', 'x.key', 'x.ord')} AS behind
                                 FROM (SELECT e.id, $6::text AS queue, e.type, e.key, e.correlation_id, e.envelope, e.ord
                                         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[])
                                              WITH ORDINALITY AS e(id, type, key, correlation_id, envelope, ord)
                                         LEFT JOIN LATERAL (SELECT true AS stored FROM ${s}.jobs AS k WHERE k.id = e.id LIMIT 1) AS known ON true
                                        WHERE known.stored IS NULL) AS x) AS c) AS b) AS h
        CROSS JOIN LATERAL (SELECT h.envelope::jsonb AS doc OFFSET 0) AS d
        ORDER BY h.key NULLS FIRST, h.ord
       ON CONFLICT (id) DO NOTHING
       RETURNING ${HANDED_RETURNING}`,
    ),
    // $1 job ids, $2 types, $3 categories, $4 messages, $5 payloads (json text), $6 correlation ids,
    // $7 queue, $8 who stored them. Dead at once, with the reason in the job's error history.
    storeDeadLetters: q(
      'ingest_dead_letters',
      `WITH dead AS (
         INSERT INTO ${s}.jobs (id, queue, type, state, attempt, max_attempts, correlation_id, finished_at, dead_reason, last_error, payload)
         SELECT d.id, $7::text, d.type, 'dead', 0, 1, d.correlation_id, now(), d.category,
                jsonb_build_object('category', d.category, 'message', d.message), d.payload::jsonb
           FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
                AS d(id, type, category, message, payload, correlation_id)
         ON CONFLICT (id) DO NOTHING
         RETURNING id, dead_reason, last_error
       )
       INSERT INTO ${s}.job_errors (job_id, claim, attempt, worker, category, message)
       SELECT id, 0, 0, $8::text, dead_reason, last_error->>'message' FROM dead`,
    ),
  };
}
