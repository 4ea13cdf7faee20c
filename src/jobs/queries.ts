import type { NamedQuery } from '../storage/driver.ts';
import { namedQueries } from '../storage/named.ts';
import { BEHIND_IN_BATCH, lockQueueKeys, orderingValues, UNFINISHED } from './ordering-sql.ts';

/**
 * Every statement of the job state machine, for one schema. The schema name is
 * a validated, quoted identifier; every value is a bind parameter. Each state
 * change of an active job is fenced: `id = $ AND claim_count = $` and the
 * state still active (`activeFence`).
 */
export interface JobQueries {
  enqueue: NamedQuery;
  enqueueInTransaction: NamedQuery;
  lockEnqueueKeys: NamedQuery;
  enqueueKeyed: NamedQuery;
  currentXid: NamedQuery;
  findUnfinishedByKey: NamedQuery;
  findRecentlyCompletedByKey: NamedQuery;
  cancelWithdrawn: NamedQuery;
  deleteWithdrawn: NamedQuery;
  claim: NamedQuery;
  claimWithFollowers: NamedQuery;
  complete: NamedQuery;
  completeOne: NamedQuery;
  completeRecordingInbox: NamedQuery;
  fail: NamedQuery;
  reschedule: NamedQuery;
  cancelRun: NamedQuery;
  releaseMany: NamedQuery;
  heartbeat: NamedQuery;
  rescueExpired: NamedQuery;
  getJob: NamedQuery;
  getErrors: NamedQuery;
}

export const WAITING = `('available', 'scheduled', 'retrying')`;

/**
 * Waiting jobs of `alias` split as the indexes hold them, for counts and sweeps that must not read
 * the completed history: not blocked is exactly jobs_claim_idx's predicate; blocked ones are within
 * jobs_ordering_idx's (only the ordering trigger blocks a job, and only a keyed one).
 */
export const WAITING_UNBLOCKED = (alias: string): string => `${alias}.state IN ${WAITING} AND NOT ${alias}.blocked`;
export const WAITING_BLOCKED = (alias: string): string => `${alias}.state IN ${WAITING} AND ${alias}.blocked AND ${alias}.ordering_key IS NOT NULL`;

/** What a claim does to a job ($3 lease ms, $4 worker id), shared by the plain and the controlled claim. */
export const CLAIM_SET = `state = 'active', attempt = j.attempt + 1, claim_count = j.claim_count + 1,
    locked_until = now() + $3::bigint * interval '1 millisecond', locked_by = $4, started_at = now()`;

/**
 * The claim's update of the rows its CTE `cte` picked (and locked): through an
 * array of their ids, so that every plan probes the primary key once per job.
 * Joined to the CTE instead, PostgreSQL hashed the picked ids and read the
 * whole table, completed history included, once the table held tens of
 * thousands of rows (a claim of 1,000 at 60,000 rows: 19 ms against 6; the
 * generic plan at 200,000: 61 ms against 6.5).
 *
 * @example
 * `UPDATE jobs AS j SET … WHERE ${claimedIn('next')} RETURNING …`
 */
export const claimedIn = (cte: string): string => `j.id = ANY (ARRAY(SELECT id FROM ${cte}))`;

/**
 * The columns a claim returns (see ClaimedRow), with `payload` the payload's expression (a broker
 * ingest's hand-off returns it only for the jobs it handed).
 */
export const claimColumns = (payload: string): string => `j.id, j.queue, j.type, ${payload}, j.attempt, j.max_attempts, j.claim_count, j.priority,
    j.correlation_id, j.created_at, j.expires_at, j.traceparent, j.ordering_key, j.ordering_seq::text AS ordering_seq, j.blocked`;

/** The columns a claim returns (see ClaimedRow). */
export const CLAIM_RETURNING = claimColumns('j.payload');

/** Which waiting jobs a claim takes first (and the order the worker starts them in). */
export const CLAIM_ORDER = 'priority DESC, run_at, id';

/**
 * A claim's rows from its update `claimed` (which returned {@link CLAIM_RETURNING}
 * and `j.run_at`), in claim order: the update returns them in the order of its
 * plan, and the worker starts a batch in the order it gets it.
 */
export const CLAIMED_IN_ORDER = (claimed: string): string =>
  `SELECT id, queue, type, payload, attempt, max_attempts, claim_count, priority, correlation_id, created_at, expires_at, traceparent,
          ordering_key, ordering_seq, blocked
     FROM ${claimed} ORDER BY ${CLAIM_ORDER}`;
/**
 * The rows of an enqueue, zipped: $1 ids, $8 dedup keys and $12 ordering keys
 * (arrays), and $11 the payloads as one JSON array, whose text is the
 * payloads' JSON joined with commas: the driver sends it as it is, where a
 * `text[]` of payloads had every character of every payload escaped for the
 * array literal. What the rows share ($4 priority, $5 run time, $6 delay in
 * ms, $9 correlation id) goes once.
 */
const ENQUEUED_ROWS = `SELECT u.id, u.dedup_key, u.payload, u.ordering_key, u.ord,
                              COALESCE($5::timestamptz, now()) + $6::bigint * interval '1 millisecond' AS run_at
                         FROM ROWS FROM (unnest($1::uuid[]), unnest($8::text[]), jsonb_array_elements($11::jsonb), unnest($12::text[]))
                              WITH ORDINALITY AS u(id, dedup_key, payload, ordering_key, ord)`;

/**
 * The enqueue statement: $1 ids, $2 queue, $3 type, $4 priority, $5 run time, $6 delay (ms),
 * $7 max attempts, $8 dedup keys, $9 correlation id, $10 max age (ms), $11 payloads (a JSON array),
 * $12 ordering keys, $13 hold key when dead, $14 traceparent (see ENQUEUED_ROWS); `guard` filters
 * the rows (a constant condition).
 */
function enqueueSql(s: string, guard: string): string {
  return `INSERT INTO ${s}.jobs (id, queue, type, state, priority, run_at, max_attempts, dedup_key, correlation_id, expires_at,
                              payload, ordering_key, hold_key_when_dead, traceparent)
       SELECT i.id, $2, $3,
              CASE WHEN i.run_at > now() THEN 'scheduled' ELSE 'available' END,
              $4::smallint, i.run_at, $7, i.dedup_key, $9::text,
              now() + $10::bigint * interval '1 millisecond', i.payload, i.ordering_key, $13::boolean, $14::text
         FROM (${ENQUEUED_ROWS}) AS i
        ${guard}
        ORDER BY i.ordering_key NULLS FIRST, i.ord
       ON CONFLICT (type, dedup_key) WHERE dedup_key IS NOT NULL AND state IN ${UNFINISHED} DO NOTHING
       RETURNING id`;
}

/**
 * The enqueue of a batch with ordering keys and no dedup keys, doing the
 * acquire trigger's work set-wise (migration 18, ordering-sql.ts) after
 * `lockEnqueueKeys`: the same parameters as {@link enqueueSql} and $15, the
 * caller's xid (null on the pool). Only for batches without dedup keys: no
 * row can then be skipped by a conflict and leave a row of its key queued
 * behind it (a dedup key here meets the unique index without ON CONFLICT, an error).
 */
function enqueueKeyedSql(s: string): string {
  return `INSERT INTO ${s}.jobs (id, queue, type, state, priority, run_at, max_attempts, dedup_key, correlation_id, expires_at,
                              payload, ordering_key, hold_key_when_dead, traceparent, ordering_seq, blocked)
       SELECT c.id, c.queue, $3,
              CASE WHEN c.run_at > now() THEN 'scheduled' ELSE 'available' END,
              $4::smallint, c.run_at, $7, c.dedup_key, $9::text,
              now() + $10::bigint * interval '1 millisecond', c.payload, c.key, $13::boolean, $14::text,
              ${orderingValues(s, 'c')}
         FROM (SELECT i.*, ${BEHIND_IN_BATCH('i.queue', 'i.key', 'i.ord')} AS behind
                 FROM (SELECT r.id, $2::text AS queue, r.dedup_key, r.payload, r.ordering_key AS key, r.ord, r.run_at
                         FROM (${ENQUEUED_ROWS}) AS r) AS i) AS c
        WHERE $15::xid8 IS NULL OR pg_current_xact_id() = $15::xid8
        ORDER BY c.key NULLS FIRST, c.ord
       RETURNING id`;
}

/** Whether a job rescheduled by $3 milliseconds would wait past its expires_at (its maxAge). */
const PAST_MAX_AGE = `COALESCE(now() + $3::bigint * interval '1 millisecond' > expires_at, false)`;
/** When lease rescue dead-letters a job (j, its expired row e): out of attempts (a follower that never started spent none), or past its max age. */
const RESCUED_DEAD = `((NOT e.unstarted AND j.attempt >= j.max_attempts) OR COALESCE(j.expires_at < now(), false))`;

/**
 * Whether a job of the same ordering key as `alias`'s row, before it in key
 * order, is in one of `states` (an index probe of the key's unfinished jobs).
 *
 * @example
 * `AND NOT ${earlierOfKey(s, 'a', WAITING)}` // no job before a's row is waiting
 */
function earlierOfKey(s: string, alias: string, states: string): string {
  return `EXISTS (SELECT 1 FROM ${s}.jobs AS b
                   WHERE b.queue = ${alias}.queue AND b.ordering_key = ${alias}.ordering_key
                     AND b.ordering_seq < ${alias}.ordering_seq AND b.state IN ${states})`;
}

/**
 * The state part of every fence on an active job (`alias`: the row's alias, or
 * `jobs`). Written as an expression so that PostgreSQL cannot
 * estimate it from the column's statistics: analyzed while no job was active,
 * those say one row is, and the planner then read every active job through
 * the lease index (or the whole table), compared with every id of a batch:
 * millions of comparisons for a completion of 1,000, every active job for a
 * single failure. Estimated by default (a small share of the table), a
 * statement probes the primary key per id, or on a small table hashes a batch.
 *
 * @example
 * `UPDATE jobs AS j ... WHERE j.id = $1 AND j.claim_count = $2 AND ${activeFence('j')}`
 */
function activeFence(alias: string): string {
  return `(${alias}.state || '') = 'active'`;
}

/** What a completion writes; the batched and the single completion share it. */
const COMPLETED = `state = 'completed', finished_at = now(), locked_until = NULL`;

/** The fenced batched completion ($1 ids, $2 claim tokens), returning the ids it completed. */
function completeBatch(s: string): string {
  return `UPDATE ${s}.jobs AS j SET ${COMPLETED}
         FROM unnest($1::uuid[], $2::int[]) AS c(id, claim)
        WHERE j.id = c.id AND j.claim_count = c.claim AND ${activeFence('j')}
       RETURNING j.id`;
}

/** Builds the job statements for a quoted schema name (see `quoteSchema`). */
export function jobQueries(quotedSchema: string): JobQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    // $1 ids, $2 queue, $3 type, $4 priorities, $5 run_at (null: now), $6 delay ms, $7 max attempts,
    // $8 dedup keys, $9 correlation ids, $10 max age ms (null: none), $11 payloads (json text),
    // $12 ordering keys, $13 hold the ordering key when dead. Ordering is assigned by a trigger, which
    // locks each key's row: rows go in key order (a key's jobs in the caller's order), so two calls
    // with the same keys lock them in the same order and cannot deadlock.
    enqueue: q('enqueue', enqueueSql(s, '')),
    // The same with $15, the xid of the caller's transaction read by its previous statement: in
    // autocommit (a client whose transaction already ended) each statement has an xid of its own, so
    // nothing is inserted, rather than a job committed on its own.
    enqueueInTransaction: q('enqueue_tx', enqueueSql(s, 'WHERE pg_current_xact_id() = $15::xid8')),
    // $1 queue, $2 ordering keys: a batch's keys locked, sorted, before `enqueueKeyed` (a statement of
    // its own, so that the insert's snapshot sees every job of those keys committed before the locks).
    lockEnqueueKeys: q('enqueue_lock_keys', lockQueueKeys(s, '$1', '$2')),
    // A batch of many jobs (enqueue.ts, SET_WISE_MIN_ROWS) with ordering keys and without dedup keys, its
    // ordering done set-wise.
    enqueueKeyed: q('enqueue_keyed', enqueueKeyedSql(s)),
    currentXid: q('jobs_current_xid', `SELECT pg_current_xact_id()::text AS xid`),
    // $1 type, $2 keys, $3 window ms: the newest completed job per key within the window.
    findRecentlyCompletedByKey: q(
      'find_completed_by_key',
      `SELECT DISTINCT ON (dedup_key) id, dedup_key FROM ${s}.jobs
        WHERE type = $1 AND dedup_key = ANY($2::text[]) AND state = 'completed'
          AND finished_at > now() - $3::bigint * interval '1 millisecond'
        ORDER BY dedup_key, finished_at DESC`,
    ),
    // $1 ids. Withdraws jobs this transaction just inserted whose key turned out to belong to a job
    // completed within the key window: cancelled first (so the ordering trigger hands their ordering
    // key on), then deleted.
    cancelWithdrawn: q('cancel_withdrawn', `UPDATE ${s}.jobs SET state = 'cancelled' WHERE id = ANY($1::uuid[]) AND state IN ${WAITING}`),
    deleteWithdrawn: q('delete_withdrawn', `DELETE FROM ${s}.jobs WHERE id = ANY($1::uuid[])`),
    findUnfinishedByKey: q(
      'find_by_key',
      `SELECT id, dedup_key FROM ${s}.jobs WHERE type = $1 AND dedup_key = ANY($2::text[]) AND state IN ${UNFINISHED}`,
    ),
    // $1 queue, $2 batch size, $3 lease ms, $4 worker id. One queue per statement: with `queue = ANY(...)`
    // PostgreSQL cannot walk the index in order and sorts the whole backlog.
    claim: q(
      'claim',
      `WITH next AS (
         SELECT id FROM ${s}.jobs
          WHERE state IN ${WAITING} AND NOT blocked AND queue = $1::text AND run_at <= now()
          ORDER BY ${CLAIM_ORDER}
          LIMIT $2
          FOR UPDATE SKIP LOCKED),
       claimed AS (
         UPDATE ${s}.jobs AS j
            SET ${CLAIM_SET}
          WHERE ${claimedIn('next')}
         RETURNING ${CLAIM_RETURNING}, j.run_at)
       ${CLAIMED_IN_ORDER('claimed')}`,
    ),
    // $1 queue, $2 batch size, $3 lease ms, $4 worker id, $5 followers per head, $6 anchor ids, $7 their
    // claim tokens, $8 followers at most. The claim above, for a queue whose jobs have ordering keys
    // (PostgreSQL plans it anew on every run, which costs more than the plain one). Behind each head
    // with an ordering key, and behind each anchor (the last follower of one of this worker's chains,
    // still active with its claim, locked here so that nothing of its key changes meanwhile), it also
    // takes up to $5 followers: the key's next jobs, as long as each is waiting, blocked and due (a run
    // of them, stopping at the first that is not), shallowest first, $8 at most. Followers stay
    // `blocked`; the worker runs each only after the job before it completed (docs/ORDERING.md). The
    // rows are updated through an array of ids (claimedIn), so that every plan probes the primary key.
    claimWithFollowers: q(
      'claim_with_followers',
      `WITH heads AS (
         SELECT id, ordering_key, ordering_seq FROM ${s}.jobs
          WHERE state IN ${WAITING} AND NOT blocked AND queue = $1::text AND run_at <= now()
          ORDER BY ${CLAIM_ORDER}
          LIMIT $2
          FOR UPDATE SKIP LOCKED),
       anchors AS (
         SELECT a.id, a.ordering_key, a.ordering_seq FROM ${s}.jobs AS a
           JOIN unnest($6::uuid[], $7::int[]) AS t(id, claim) ON a.id = t.id AND a.claim_count = t.claim
          WHERE ${activeFence('a')} AND a.queue = $1::text AND a.ordering_key IS NOT NULL
            -- A job before it waiting again (it failed or was snoozed) broke the chain: its followers
            -- go back, and the key's next jobs come behind that job once it is claimed again.
            AND NOT ${earlierOfKey(s, 'a', WAITING)}
          FOR UPDATE OF a SKIP LOCKED),
       followers AS (
         SELECT f.id FROM (SELECT * FROM heads WHERE ordering_key IS NOT NULL UNION ALL SELECT * FROM anchors) AS h
          CROSS JOIN LATERAL (
            SELECT r.id, r.depth FROM (
              SELECT n.id, row_number() OVER w AS depth,
                     bool_and(n.state = 'available' AND n.blocked AND n.run_at <= now()) OVER w AS runnable
                FROM (SELECT x.id, x.state, x.blocked, x.run_at, x.ordering_seq FROM ${s}.jobs AS x
                       WHERE x.queue = $1::text AND x.ordering_key = h.ordering_key AND x.ordering_seq > h.ordering_seq
                         AND x.state IN ${UNFINISHED}
                       ORDER BY x.ordering_seq
                       LIMIT $5) AS n
              WINDOW w AS (ORDER BY n.ordering_seq)) AS r
             WHERE r.runnable) AS f
          WHERE $5::int > 0 AND $8::int > 0
          ORDER BY f.depth
          LIMIT $8),
       picked AS (SELECT id FROM heads UNION ALL SELECT id FROM followers)
       UPDATE ${s}.jobs AS j
          SET ${CLAIM_SET}
        WHERE ${claimedIn('picked')} AND j.state IN ${WAITING}
       RETURNING ${CLAIM_RETURNING}`,
    ),
    // $1 ids, $2 claim tokens
    complete: q(
      'complete',
      completeBatch(s),
    ),
    // $1 id, $2 claim token: the completion of one job (a handler's transaction, a batch of one).
    // Its parameters are scalars, so PostgreSQL plans it once per connection (a probe of the
    // primary key): the batched form, whose plan depends on the arrays' length, is planned anew
    // on every run (0.15-0.3 ms, docs/BENCHMARKS.md, session 43).
    completeOne: q(
      'complete_one',
      `UPDATE ${s}.jobs AS j SET ${COMPLETED}
        WHERE j.id = $1::uuid AND j.claim_count = $2::int AND ${activeFence('j')}
       RETURNING j.id`,
    ),
    // $1 ids, $2 claims, $3 consumer groups, $4 inbox keys (null where a job has none): the
    // completion above, and in the same statement each completed job's inbox key (a consumer
    // handler that never opened ctx.tx). A key already there (another delivery recorded it
    // meanwhile) is left as it is.
    completeRecordingInbox: q(
      'complete_recording_inbox',
      `WITH done AS (${completeBatch(s)}),
       recorded AS (
         INSERT INTO ${s}.inbox (consumer_group, event_id)
         SELECT k.consumer_group, k.event_id
           FROM unnest($1::uuid[], $3::text[], $4::uuid[]) AS k(id, consumer_group, event_id)
           JOIN done ON done.id = k.id
          WHERE k.consumer_group IS NOT NULL
          ORDER BY k.consumer_group, k.event_id
         ON CONFLICT DO NOTHING)
       SELECT id FROM done`,
    ),
    // $1 id, $2 claim, $3 retry wanted, $4 delay ms, $5 dead reason if not retried,
    // $6 category, $7 message, $8 stack. Past expires_at a retry becomes a dead letter ('max-age').
    fail: q(
      'fail',
      `WITH decided AS (
         SELECT id, ($3::boolean AND (expires_at IS NULL OR now() + $4::bigint * interval '1 millisecond' <= expires_at)) AS retry
           FROM ${s}.jobs WHERE id = $1 AND claim_count = $2 AND ${activeFence('jobs')}),
       updated AS (
         UPDATE ${s}.jobs AS j
            SET state = CASE WHEN d.retry THEN 'retrying' ELSE 'dead' END,
                run_at = CASE WHEN d.retry THEN now() + $4::bigint * interval '1 millisecond' ELSE j.run_at END,
                finished_at = CASE WHEN d.retry THEN NULL ELSE now() END,
                dead_reason = CASE WHEN d.retry THEN NULL WHEN $3::boolean THEN 'max-age' ELSE $5 END,
                locked_until = NULL, blocked = false,
                last_error = jsonb_build_object('category', $6::text, 'message', $7::text)
           FROM decided AS d
          WHERE j.id = d.id AND j.claim_count = $2 AND ${activeFence('j')}
         RETURNING j.id, j.claim_count, j.attempt, j.state, j.run_at, j.locked_by, j.started_at)
       INSERT INTO ${s}.job_errors (job_id, claim, attempt, worker, started_at, category, message, stack)
       SELECT id, claim_count, attempt, locked_by, started_at, $6, $7, $8 FROM updated
       RETURNING (SELECT state FROM updated) AS state, (SELECT run_at FROM updated) AS run_at`,
    ),
    // $1 id, $2 claim, $3 delay ms, $4 error category (null for a snooze), $5 message. Snooze and
    // rate limit: back to waiting, the attempt not spent; but a job that would wait past its
    // expires_at is dead-lettered ('max-age') instead, so that no job snoozes forever.
    // `blocked = false` here and in `fail`: a job that ran is its key's head (a follower runs only
    // after the jobs before it completed), so it keeps holding the key.
    reschedule: q(
      'reschedule',
      `UPDATE ${s}.jobs
          SET state = CASE WHEN ${PAST_MAX_AGE} THEN 'dead' WHEN $3::bigint > 0 THEN 'scheduled' ELSE 'available' END,
              run_at = CASE WHEN ${PAST_MAX_AGE} THEN run_at ELSE now() + $3::bigint * interval '1 millisecond' END,
              attempt = CASE WHEN ${PAST_MAX_AGE} THEN attempt ELSE attempt - 1 END,
              finished_at = CASE WHEN ${PAST_MAX_AGE} THEN now() END,
              dead_reason = CASE WHEN ${PAST_MAX_AGE} THEN 'max-age' END,
              last_error = CASE WHEN ${PAST_MAX_AGE} THEN jsonb_strip_nulls(jsonb_build_object('category', $4::text, 'message', $5::text)) ELSE last_error END,
              locked_until = NULL, blocked = false
        WHERE id = $1 AND claim_count = $2 AND ${activeFence('jobs')}
       RETURNING id, state`,
    ),
    // $1 id, $2 claim, $3 reason. A handler returned cancel(reason): the job ends as cancelled, the
    // reason kept as its last word (it holds its ordering key no more: the trigger hands it on).
    cancelRun: q(
      'cancel_run',
      `UPDATE ${s}.jobs
          SET state = 'cancelled', finished_at = now(), locked_until = NULL, blocked = false,
              last_error = jsonb_build_object('category', 'cancelled', 'message', $3::text)
        WHERE id = $1 AND claim_count = $2 AND ${activeFence('jobs')}
       RETURNING id`,
    ),
    // $1 ids, $2 claim tokens. Graceful stop: claimed jobs back to the queue at once, the attempt not spent.
    releaseMany: q(
      'release_many',
      `UPDATE ${s}.jobs AS j SET state = 'available', run_at = now(), attempt = j.attempt - 1, locked_until = NULL
         FROM unnest($1::uuid[], $2::int[]) AS c(id, claim)
        WHERE j.id = c.id AND j.claim_count = c.claim AND ${activeFence('j')}
       RETURNING j.id, j.type`,
    ),
    // $1 ids, $2 claim tokens, $3 lease ms
    heartbeat: q(
      'heartbeat',
      `UPDATE ${s}.jobs AS j SET locked_until = now() + $3::bigint * interval '1 millisecond'
         FROM unnest($1::uuid[], $2::int[]) AS c(id, claim)
        WHERE j.id = c.id AND j.claim_count = c.claim AND ${activeFence('j')}
       RETURNING j.id, j.claim_count`,
    ),
    // $1 batch size, $2 message. Counts the attempt; touches a job only if still active with the claim it read.
    // A follower (claimed behind its key's head, still blocked) with an unfinished job before it never
    // started: it goes back to waiting behind its key, blocked, without spending the attempt. A job
    // with none before it may have run (a follower starts once the job before it completed): its
    // attempt counts, and as its key's head it holds the key (blocked = false).
    rescueExpired: q(
      'rescue',
      `WITH expired AS (
         SELECT x.id, x.claim_count,
                x.blocked AND ${earlierOfKey(s, 'x', UNFINISHED)} AS unstarted
           FROM ${s}.jobs AS x
          WHERE x.state = 'active' AND x.locked_until < now()
          ORDER BY x.locked_until LIMIT $1
          FOR UPDATE OF x SKIP LOCKED),
       updated AS (
         UPDATE ${s}.jobs AS j
            SET state = CASE WHEN ${RESCUED_DEAD} THEN 'dead' WHEN e.unstarted THEN 'available' ELSE 'retrying' END,
                dead_reason = CASE WHEN NOT e.unstarted AND j.attempt >= j.max_attempts THEN 'max-attempts' WHEN j.expires_at < now() THEN 'max-age' END,
                finished_at = CASE WHEN ${RESCUED_DEAD} THEN now() END,
                attempt = CASE WHEN e.unstarted THEN j.attempt - 1 ELSE j.attempt END,
                blocked = e.unstarted AND NOT ${RESCUED_DEAD},
                run_at = now(), locked_until = NULL,
                last_error = jsonb_build_object('category', 'lease-expired', 'message', $2::text)
           FROM expired AS e
          WHERE j.id = e.id AND j.claim_count = e.claim_count AND ${activeFence('j')}
         RETURNING j.id, j.queue, j.type, j.claim_count, j.attempt, j.state, j.locked_by, j.started_at),
       logged AS (
         INSERT INTO ${s}.job_errors (job_id, claim, attempt, worker, started_at, category, message)
         SELECT id, claim_count, attempt, locked_by, started_at, 'lease-expired', $2 FROM updated)
       SELECT id, queue, type, attempt, state FROM updated`,
    ),
    getJob: q(
      'get_job',
      `SELECT id, queue, type, state, priority, run_at, attempt, max_attempts, claim_count, locked_until, locked_by,
              dedup_key, ordering_key, blocked, correlation_id, expires_at, created_at, started_at, finished_at, dead_reason,
              last_error, payload
         FROM ${s}.jobs WHERE id = $1`,
    ),
    getErrors: q(
      'get_errors',
      `SELECT claim, attempt, worker, started_at, category, message, stack, failed_at FROM ${s}.job_errors WHERE job_id = $1 ORDER BY claim`,
    ),
  };
}
