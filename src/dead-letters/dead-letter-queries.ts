import type { NamedQuery } from '../storage/driver.ts';
import { namedQueries } from '../storage/named.ts';
import { CANCEL_SET, retrySet } from '../jobs/admin-queries.ts';
import { UNFINISHED } from '../jobs/ordering-sql.ts';

/** Statements of the dead-letter queue (list, show, replay, discard, their records), for one quoted schema. */
export interface DeadLetterQueries {
  list: NamedQuery;
  count: NamedQuery;
  matchIds: NamedQuery;
  startRecord: NamedQuery;
  finishRecord: NamedQuery;
  replayBatch: NamedQuery;
  discardBatch: NamedQuery;
  wake: NamedQuery;
  replaysOf: NamedQuery;
}

/**
 * The filter ($1 queue, $2 type, $3 category, $4 since, $5 until, $6 ids, $7 ILIKE pattern; each
 * NULL for "any") over dead jobs `j`. The category matches the last error's category or the dead
 * reason (`max-attempts`, `max-age`). Every value is a bind parameter (see filter.ts).
 */
function matches(j: string): string {
  return `${j}.state = 'dead'
    AND ($1::text IS NULL OR ${j}.queue = $1::text)
    AND ($2::text IS NULL OR ${j}.type = $2::text)
    AND ($3::text IS NULL OR ${j}.last_error->>'category' = $3::text OR ${j}.dead_reason = $3::text)
    AND ($4::timestamptz IS NULL OR ${j}.finished_at >= $4::timestamptz)
    AND ($5::timestamptz IS NULL OR ${j}.finished_at <= $5::timestamptz)
    AND ($6::uuid[] IS NULL OR ${j}.id = ANY($6::uuid[]))
    AND ($7::text IS NULL OR ${j}.last_error->>'message' ILIKE $7::text ESCAPE '\\')`;
}
const MATCHES = matches('j');


/**
 * A dead job `j` whose dedup key an unfinished job holds now, or a matching dead job of the same
 * key that died before it (replayed first, it will hold the key): replaying `j` would break the
 * key's uniqueness. The filter's parameters are the ones of MATCHES.
 */
function keyHeld(s: string): string {
  return `j.dedup_key IS NOT NULL AND (EXISTS (
      SELECT 1 FROM ${s}.jobs AS o WHERE o.type = j.type AND o.dedup_key = j.dedup_key AND o.state IN ${UNFINISHED})
    OR EXISTS (
      SELECT 1 FROM ${s}.jobs AS d WHERE d.type = j.type AND d.dedup_key = j.dedup_key AND d.id <> j.id
         AND (d.finished_at, d.id) < (j.finished_at, j.id) AND ${matches('d')}))`;
}

/** The columns of a dead letter (see DeadLetterRow in dead-letter.ts). */
const COLUMNS = `j.id, j.queue, j.type, j.dead_reason, j.last_error, j.attempt, j.max_attempts, j.correlation_id,
       j.created_at, j.finished_at, j.payload,
       to_char(j.finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS died_at_exact`;

/**
 * One batch of a replay or discard ($8 record id, $9 batch size): dead jobs of the filter that died
 * before the record was started, oldest death first, locked (`SKIP LOCKED`: a concurrent replay
 * takes others), changed by `set` only while still dead, each linked to the record, the record's
 * count moved in the same transaction. Returns the changed jobs' ids and queues.
 *
 * "Died before the record started" is what keeps a job replayed by this record, which died again
 * meanwhile, from being replayed twice: its new death is later. (It replaced a probe of the record's
 * links per dead job, which PostgreSQL planned as a scan of every link while the link table had no
 * statistics: a replay of 20,000 dead jobs took a minute, each batch slower than the one before.)
 */
function batch(s: string, set: string, skipKeyHeld: boolean): string {
  return `WITH pick AS (
         SELECT j.id, j.finished_at, j.dead_reason, j.attempt FROM ${s}.jobs AS j
          WHERE ${MATCHES}
            AND j.finished_at <= (SELECT r.started_at FROM ${s}.dead_letter_replays AS r WHERE r.id = $8::uuid)
            ${skipKeyHeld ? `AND NOT (${keyHeld(s)})` : ''}
          ORDER BY j.finished_at, j.id
          LIMIT $9
          FOR UPDATE OF j SKIP LOCKED),
       changed AS (
         UPDATE ${s}.jobs AS t SET ${set}
          WHERE t.id IN (SELECT id FROM pick) AND t.state = 'dead'
         RETURNING t.id, t.queue),
       linked AS (
         INSERT INTO ${s}.dead_letter_replay_jobs (job_id, replay_id, died_at, dead_reason, attempt)
         SELECT p.id, $8::uuid, p.finished_at, p.dead_reason, p.attempt FROM pick AS p JOIN changed AS c ON c.id = p.id
         RETURNING job_id),
       counted AS (
         UPDATE ${s}.dead_letter_replays SET replayed = replayed + (SELECT count(*) FROM linked) WHERE id = $8::uuid
         RETURNING replayed)
       SELECT c.id, c.queue, (SELECT replayed FROM counted) AS total FROM changed AS c`;
}

/** Builds the dead-letter statements for a quoted schema name. */
export function deadLetterQueries(quotedSchema: string): DeadLetterQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  // A replayed job's fresh budget of attempts: its type's maxAttempts when this process has the
  // definition ($10 types, $11 budgets), else the budget it had (as jobs.retry does).
  const budget = `COALESCE((SELECT u.budget FROM unnest($10::text[], $11::int[]) AS u(type, budget) WHERE u.type = t.type), t.max_attempts)`;
  return {
    // filter, $8 cursor time (exact, text), $9 cursor id, $10 page size. Newest death first.
    list: q(
      'dead_list',
      `SELECT ${COLUMNS} FROM ${s}.jobs AS j
        WHERE ${MATCHES}
          AND ($8::timestamptz IS NULL OR j.finished_at < $8::timestamptz OR (j.finished_at = $8::timestamptz AND j.id < $9::uuid))
        ORDER BY j.finished_at DESC, j.id DESC
        LIMIT $10`,
    ),
    // filter. How many match, and how many of those a replay would leave (their dedup key is held).
    count: q(
      'dead_count',
      `SELECT count(*)::int AS matched, count(*) FILTER (WHERE ${keyHeld(s)})::int AS key_held
         FROM ${s}.jobs AS j WHERE ${MATCHES}`,
    ),
    // filter (with $6 ids): which of the ids are matching dead letters.
    matchIds: q('dead_match_ids', `SELECT j.id FROM ${s}.jobs AS j WHERE ${MATCHES}`),
    // $1 id, $2 action, $3 filter json, $4 matched, $5 dry run, $6 by. A dry run is finished at once.
    startRecord: q(
      'dead_record_start',
      `INSERT INTO ${s}.dead_letter_replays (id, action, filter, matched, dry_run, by, finished_at)
       VALUES ($1, $2, $3::jsonb, $4, $5, $6, CASE WHEN $5::boolean THEN now() END)`,
    ),
    // $1 id, $2 interrupted
    finishRecord: q(
      'dead_record_finish',
      `UPDATE ${s}.dead_letter_replays SET finished_at = now(), interrupted = $2 WHERE id = $1 RETURNING replayed`,
    ),
    replayBatch: q('dead_replay_batch', batch(s, retrySet(budget), true)),
    discardBatch: q('dead_discard_batch', batch(s, CANCEL_SET, false)),
    // $1 channel, $2 queues: wakes the queues' workers (as an insert does) instead of waiting for their poll.
    wake: q('dead_wake', `SELECT pg_notify($1::text, q) FROM unnest($2::text[]) AS q`),
    // $1 job id: every replay or discard of the job, oldest first.
    replaysOf: q(
      'dead_replays_of',
      `SELECT x.id, x.action, x.by, r.at, r.died_at, r.dead_reason, r.attempt
         FROM ${s}.dead_letter_replay_jobs AS r JOIN ${s}.dead_letter_replays AS x ON x.id = r.replay_id
        WHERE r.job_id = $1
        ORDER BY r.at, x.started_at`,
    ),
  };
}
