/**
 * The ordering acquire done by an insert itself, set-wise (migration 18), for
 * the statements that insert batches of keyed jobs: the relay's fan-out and a
 * broker group's ingest. Such an insert runs after a statement that locked its
 * keys (`lockOrderingKeys`), so that its snapshot sees every job of those keys
 * committed before the locks were granted, as the trigger's statements did.
 * Rows inserted without an `ordering_seq` still go through the trigger.
 */
/** The states of a job not yet finished (a job in one of them keeps its ordering key). */
export const UNFINISHED = `('scheduled', 'available', 'active', 'retrying')`;

/** A job that holds its ordering key or queues behind it: unfinished, or dead holding it. */
export const KEEPS_KEY = (j: string): string => `(${j}.state IN ${UNFINISHED} OR (${j}.state = 'dead' AND ${j}.hold_key_when_dead))`;

/**
 * Locks the (queue, key) pairs that `pairs` selects (columns queue, key; no
 * null key): their `ordering_keys` rows upserted in (queue, key) order, the
 * order the release trigger locks them in, and held until the transaction ends.
 *
 * @example
 * lockOrderingKeys('"mailroom"', `SELECT DISTINCT $2::text, k FROM unnest($1::text[]) AS k WHERE k IS NOT NULL`)
 */
export function lockOrderingKeys(s: string, pairs: string): string {
  return `INSERT INTO ${s}.ordering_keys AS k (queue, key)
       SELECT p.queue, p.key FROM (${pairs}) AS p(queue, key) ORDER BY 1, 2
       ON CONFLICT (queue, key) DO UPDATE SET touched_at = now()`;
}

/**
 * Locks the ordering keys `keys` (a text[] parameter) of one queue (`queue`, a
 * text parameter), as {@link lockOrderingKeys} does: for a batch of one queue.
 *
 * @example
 * lockQueueKeys('"mailroom"', '$2', '$1') // $1 keys, $2 queue
 */
export function lockQueueKeys(s: string, queue: string, keys: string): string {
  return lockOrderingKeys(s, `SELECT DISTINCT ${queue}::text, k FROM unnest(${keys}::text[]) AS k WHERE k IS NOT NULL`);
}

/**
 * True for a row that an earlier row of the same queue and key in the same
 * batch comes before (`ord`: the batch's order), to be computed where the
 * batch holds only rows it will insert.
 */
export const BEHIND_IN_BATCH = (queue: string, key: string, ord: string): string =>
  `${key} IS NOT NULL AND count(*) OVER (PARTITION BY ${queue}, ${key} ORDER BY ${ord} ROWS UNBOUNDED PRECEDING) > 1`;

/**
 * Whether a row `c` with `queue`, `key` and `behind` (BEHIND_IN_BATCH) is
 * blocked: keyed, and behind an earlier row of the batch or a stored job that
 * keeps the key. The probe is a scalar subquery with LIMIT, which cannot
 * become a join that reads the whole table on statistics taken while it was small.
 */
export function blockedValue(s: string, c: string): string {
  return `${c}.key IS NOT NULL AND (${c}.behind OR (SELECT true FROM ${s}.jobs AS held
                                                         WHERE held.queue = ${c}.queue AND held.ordering_key = ${c}.key AND ${KEEPS_KEY('held')}
                                                         LIMIT 1) IS NOT NULL)`;
}

/**
 * The `ordering_seq` of a row `c` with a `key`: a keyed row takes the next seq.
 * nextval is volatile, so in the insert's own select list it runs after the
 * statement's sort: the batch's order.
 */
export function orderingSeq(s: string, c: string): string {
  return `CASE WHEN ${c}.key IS NOT NULL THEN nextval('${s}.jobs_ordering_seq') END`;
}

/**
 * The `ordering_seq` and `blocked` values of a row `c` with `queue`, `key` and
 * `behind` (see {@link orderingSeq} and {@link blockedValue}).
 */
export function orderingValues(s: string, c: string): string {
  return `${orderingSeq(s, c)},
              ${blockedValue(s, c)}`;
}
