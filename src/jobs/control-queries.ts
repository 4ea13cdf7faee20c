import type { NamedQuery } from '../storage/driver.ts';
import { namedQueries } from '../storage/named.ts';
import { CLAIM_ORDER, CLAIM_RETURNING, CLAIM_SET, CLAIMED_IN_ORDER, claimedIn, WAITING } from './queries.ts';

/** Statements of shared queue limits (rate limit, global concurrency, back-off), for one quoted schema. */
export interface ControlQueries {
  configure: NamedQuery;
  controlledAmong: NamedQuery;
  claimControlled: NamedQuery;
  pause: NamedQuery;
  lock: NamedQuery;
}


/** Builds the queue-control statements for a quoted schema name. */
export function controlQueries(quotedSchema: string): ControlQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    // $1 queue, $2 rate max (null: none), $3 rate window ms, $4 concurrency (null: none)
    configure: q(
      'configure_queue',
      `INSERT INTO ${s}.queue_controls (queue, rate_max, rate_per_ms, concurrency) VALUES ($1, $2, $3, $4)
       ON CONFLICT (queue) DO UPDATE
         SET rate_max = EXCLUDED.rate_max, rate_per_ms = EXCLUDED.rate_per_ms, concurrency = EXCLUDED.concurrency, updated_at = now()`,
    ),
    // $1 queues: those with a limit, or backed off within the last hour (a provider that said 429
    // may say it again, and a process learns of a new back-off only through the control row's lock;
    // an hour after the last one, or with limits removed, the row no longer sends claims through it).
    controlledAmong: q(
      'controlled_queues',
      `SELECT queue FROM ${s}.queue_controls
        WHERE queue = ANY($1::text[]) AND (rate_max IS NOT NULL OR concurrency IS NOT NULL OR paused_until > now() - interval '1 hour')`,
    ),
    // $1 queue, $2 batch size, $3 lease ms, $4 worker id. Claims of a controlled queue take its control
    // row's lock, so every process sees the same window and the same count of active jobs.
    claimControlled: q(
      'claim_controlled',
      `WITH ctl AS (
         SELECT rate_max, rate_per_ms, concurrency, paused_until,
                ARRAY(SELECT t FROM unnest(recent_claims) AS t WHERE t > now() - rate_per_ms * interval '1 millisecond' ORDER BY t) AS window_claims
           FROM ${s}.queue_controls WHERE queue = $1 FOR UPDATE),
       allowance AS (
         SELECT CASE WHEN paused_until > now() THEN 0
                     ELSE greatest(0, least(
                       $2::int,
                       COALESCE(rate_max - cardinality(window_claims), $2::int),
                       COALESCE(concurrency - (SELECT count(*) FROM ${s}.jobs WHERE queue = $1 AND state = 'active')::int, $2::int)))
                END AS n
           FROM ctl),
       next AS (
         SELECT id FROM ${s}.jobs
          WHERE state IN ${WAITING} AND NOT blocked AND queue = $1 AND run_at <= now()
          ORDER BY ${CLAIM_ORDER}
          LIMIT COALESCE((SELECT n FROM allowance), $2::int)
          FOR UPDATE SKIP LOCKED),
       claimed AS (
         UPDATE ${s}.jobs AS j
            SET ${CLAIM_SET}
          WHERE ${claimedIn('next')}
         RETURNING ${CLAIM_RETURNING}, j.run_at),
       recorded AS (
         UPDATE ${s}.queue_controls
            SET recent_claims = (SELECT window_claims FROM ctl) || ARRAY(SELECT now() FROM claimed)
          WHERE queue = $1 AND rate_max IS NOT NULL AND EXISTS (SELECT 1 FROM claimed))
       ${CLAIMED_IN_ORDER('claimed')}`,
    ),
    // $1 queue. Taken first, in its own statement, so that the claim statement after it (a new
    // snapshot) sees every claim committed by the previous holder of the lock.
    lock: q('lock_queue', `SELECT 1 FROM ${s}.queue_controls WHERE queue = $1 FOR UPDATE`),
    // $1 queue, $2 back-off ms: no claims from the queue until then.
    pause: q(
      'pause_queue',
      `INSERT INTO ${s}.queue_controls (queue, paused_until) VALUES ($1, now() + $2::bigint * interval '1 millisecond')
       ON CONFLICT (queue) DO UPDATE
         SET paused_until = greatest(COALESCE(${s}.queue_controls.paused_until, now()), EXCLUDED.paused_until), updated_at = now()`,
    ),
  };
}
