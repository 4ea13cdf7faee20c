import { abortableDriver } from '../storage/abortable-driver.ts';
import { checkSignal } from '../signal-option.ts';
import type { JobDefinition } from '../define.ts';
import { toMilliseconds, type Duration } from '../duration.ts';
import { TransactionEndedError, ValidationError } from '../errors.ts';
import { newId } from '../ids.ts';
import { checkOptionNames, type OptionNames } from '../option-names.ts';
import { hasLoneSurrogate, LONE_SURROGATE_FIX, serializePayload, validatePayload } from '../payload.ts';
import { asQueryable, runNamed, type Driver, type Queryable, type TransactionLike } from '../storage/driver.ts';
import type { JobQueries } from './queries.ts';
import { currentContext } from '../observe/context.ts';
import { inProducerSpan } from '../observe/tracing.ts';

/** Options of `enqueue`. */
export interface EnqueueOptions {
  /** Deduplication key: while a job of this type with this key is unfinished, enqueue returns its id and adds nothing. */
  key?: string;
  /** Run no sooner than this long from now. */
  delay?: Duration;
  /** Run no sooner than this time. `delay` adds to it when both are given. */
  runAt?: Date;
  /** Higher runs first; -32768 to 32767, default 0. */
  priority?: number;
  /** Carried through to the job, its logs and its history. */
  correlationId?: string;
  /** Jobs with the same ordering key (per queue) run one at a time, in enqueue order. */
  orderingKey?: string;
  /** Enqueue inside this transaction: the job exists if and only if it commits. */
  tx?: TransactionLike;
  /**
   * Without `tx`: ends the enqueue when aborted (its statements cancelled on
   * the server, nothing written) and rejects with the signal's reason. Not
   * with `tx`: give the signal to `mailroom.transaction(fn, { signal })`.
   */
  signal?: AbortSignal;
}

/** Options of `enqueueMany`: like {@link EnqueueOptions}, with the key computed per item. */
export interface EnqueueManyOptions<TInput> extends Omit<EnqueueOptions, 'key' | 'orderingKey'> {
  key?: (data: TInput, index: number) => string;
  /** The ordering key of each item (or one for all). */
  orderingKey?: string | ((data: TInput, index: number) => string);
}

interface PreparedRow {
  id: string;
  key: string | null;
  orderingKey: string | null;
  payload: string;
}

const MAX_KEY_LENGTH = 512;

function checkText(value: unknown, what: string): string | null {
  if (value === undefined || value === null) return null;
  if (typeof value !== 'string' || value.length === 0 || value.length > MAX_KEY_LENGTH || value.includes('\u0000')) {
    throw new ValidationError(`${what} must be a non-empty string of at most ${MAX_KEY_LENGTH} characters without NUL`, [
      { path: what, message: 'invalid' },
    ]);
  }
  if (hasLoneSurrogate(value)) {
    throw new ValidationError(`${what} ${LONE_SURROGATE_FIX}`, [
      { path: what, message: 'lone surrogate' },
    ]);
  }
  return value;
}

/**
 * The options argument of `enqueue` / `enqueueMany`: undefined or null mean
 * none; anything else that is not an object is refused.
 *
 * @example
 * const { key, ...rest } = enqueueOptionsOf(options); // options ?? {}, checked
 */
export function enqueueOptionsOf<T extends object>(options: T | null | undefined): T {
  if (options === undefined || options === null) return {} as T;
  if (typeof options !== 'object') {
    throw new ValidationError(`enqueue: options must be an object such as { key, delay, priority }, got ${typeof options}`, [{ path: 'options', message: 'not an object' }]);
  }
  return options;
}

function orderingKeyOf<TInput>(option: EnqueueManyOptions<TInput>['orderingKey'], data: TInput, index: number, count: number): string | null {
  if (option === undefined) return null;
  const value: unknown = typeof option === 'function' ? option(data, index) : option;
  const what = count > 1 ? `orderingKey (item ${index})` : 'orderingKey';
  if (typeof value !== 'string') {
    throw new ValidationError(`${what} must be a string (e.g. an order or account id), got ${value === null ? 'null' : typeof value}`, [
      { path: 'orderingKey', message: 'not a string' },
    ]);
  }
  return checkText(value, what);
}

function checkPriority(priority: unknown): number {
  if (priority === undefined) return 0;
  if (!Number.isInteger(priority) || (priority as number) < -32768 || (priority as number) > 32767) {
    throw new ValidationError(`priority must be an integer from -32768 to 32767, got ${String(priority)}`, [{ path: 'priority', message: 'invalid' }]);
  }
  return priority as number;
}

const MAX_DELAY_MS = 100 * 365 * 86_400_000;
const MIN_RUN_AT = Date.UTC(1970, 0, 1);
const MAX_RUN_AT = Date.UTC(9999, 0, 1);

function checkRunAt(runAt: unknown): Date | null {
  if (runAt === undefined) return null;
  if (!(runAt instanceof Date) || Number.isNaN(runAt.getTime())) {
    throw new ValidationError('runAt must be a valid Date', [{ path: 'runAt', message: 'invalid date' }]);
  }
  if (runAt.getTime() < MIN_RUN_AT || runAt.getTime() >= MAX_RUN_AT) {
    throw new ValidationError(`runAt must be between 1970 and 9999, got ${runAt.toISOString()}`, [{ path: 'runAt', message: 'out of range' }]);
  }
  return runAt;
}

function checkDelay(delay: EnqueueOptions['delay']): number {
  if (delay === undefined) return 0;
  const ms = toMilliseconds(delay, 'delay');
  if (ms > MAX_DELAY_MS) {
    throw new ValidationError(`delay must be at most 100 years (${MAX_DELAY_MS} ms), got ${ms} ms; use runAt for a fixed time`, [
      { path: 'delay', message: 'too long' },
    ]);
  }
  return ms;
}

const ENQUEUE_OPTION_NAMES: OptionNames<EnqueueOptions> = { key: true, delay: true, runAt: true, priority: true, correlationId: true, orderingKey: true, tx: true, signal: true };

/**
 * Validates and writes jobs of one type in one statement; returns their ids in
 * input order (for a deduplicated item, the id of the unfinished job that
 * already had its key, or of the job that completed with it within `keyWindowMs`).
 */
export async function enqueueJobs<TData, TInput>(
  driver: Driver,
  queries: JobQueries,
  maxPayloadBytes: number,
  def: JobDefinition<TData, TInput>,
  items: readonly TInput[],
  options: EnqueueManyOptions<TInput>,
  keyWindowMs = 0,
): Promise<string[]> {
  if (typeof def !== 'object' || def === null || def.kind !== 'job') {
    throw new TypeError('enqueue: the first argument must be a job definition made by defineJob()');
  }
  checkOptionNames(options, ENQUEUE_OPTION_NAMES, `enqueue ${def.name}`);
  const what = `job ${def.name}`;
  const delayMs = checkDelay(options.delay);
  const runAt = checkRunAt(options.runAt);
  const priority = checkPriority(options.priority);
  // Inside a handler or withCorrelation(), the request's correlation id travels on unless one is given.
  const correlationId = checkText(options.correlationId, 'correlationId') ?? currentContext()?.correlationId ?? null;
  // Only undefined and null mean "no transaction": any other value must be a transaction handle (asQueryable refuses the rest).
  const inTx = options.tx !== undefined && options.tx !== null;
  const signal = checkSignal(options.signal, `enqueue ${def.name}`, inTx);
  const pool = signal ? abortableDriver(driver, signal) : driver;
  const db: Queryable = inTx ? asQueryable(options.tx!) : pool;

  const rows: PreparedRow[] = [];
  let payloadChars = 0; // the batch's payload text, as one JSON array (see STATEMENT_PAYLOAD_CHARS)
  const firstByKey = new Map<string, number>();
  const resultIndex: number[] = [];
  for (let i = 0; i < items.length; i++) {
    // With several items, say which one was bad.
    const itemWhat = items.length > 1 ? `${what} (item ${i})` : what;
    const value = await validatePayload(def.schema, items[i], itemWhat);
    const payload = serializePayload(value, maxPayloadBytes, itemWhat);
    const key = options.key ? checkText(options.key(items[i] as TInput, i), items.length > 1 ? `key (item ${i})` : 'key') : null;
    if (key !== null) {
      const earlier = firstByKey.get(key);
      if (earlier !== undefined) {
        resultIndex.push(earlier);
        continue;
      }
      firstByKey.set(key, rows.length);
    }
    const orderingKey = orderingKeyOf(options.orderingKey, items[i] as TInput, i, items.length);
    resultIndex.push(rows.length);
    rows.push({ id: newId(), key, orderingKey, payload });
    payloadChars += payload.length + 1;
  }
  if (rows.length === 0) return [];
  const oneStatement = payloadChars <= STATEMENT_PAYLOAD_CHARS;

  const write = async (db: Queryable): Promise<string[]> => {
    // In the caller's transaction: its xid, which the insert checks (see enqueueInTransaction).
    const xid = inTx ? await transactionXid(db, queries, what) : null;
    // Keys of jobs completed within the key window still deduplicate (a redelivered request).
    const completedByKey = keyWindowMs > 0 ? await recentlyCompleted(db, queries, def.name, rows, keyWindowMs) : new Map<string, string>();
    const fresh = rows.filter((r) => r.key === null || !completedByKey.has(r.key));
    const inserted =
      fresh.length > 0
        ? await inProducerSpan(`enqueue ${def.name}`, { 'messaging.system': 'mailroom', 'messaging.destination.name': def.queue, 'messaging.batch.message_count': fresh.length }, (traceparent) =>
            insertInStatements(db, queries, def, fresh, { delayMs, runAt, priority, correlationId, traceparent, xid, what }, oneStatement),
          )
        : [];
    const idOf = new Map(fresh.map((r, i) => [r, inserted[i]!]));
    if (keyWindowMs > 0) {
      // The job holding a key can complete while this insert runs: the insert waits for that completion's
      // row lock, then finds no unfinished job with the key and inserts (and a key whose job completed
      // between the look-up and the retry in insertRows is inserted too). Checked again after the insert,
      // in the same transaction, such a row is withdrawn before anyone sees it and the completed job's id
      // is returned.
      const ours = fresh.filter((r) => r.key !== null && idOf.get(r) === r.id);
      const late = ours.length > 0 ? await recentlyCompleted(db, queries, def.name, ours, keyWindowMs) : new Map<string, string>();
      const withdrawn = ours.filter((r) => late.has(r.key!));
      if (withdrawn.length > 0) {
        await runNamed(db, queries.cancelWithdrawn, [withdrawn.map((r) => r.id)]);
        await runNamed(db, queries.deleteWithdrawn, [withdrawn.map((r) => r.id)]);
        for (const r of withdrawn) idOf.set(r, late.get(r.key!)!);
      }
    }
    const ids = rows.map((r) => idOf.get(r) ?? completedByKey.get(r.key!)!);
    return resultIndex.map((i) => ids[i]!);
  };
  // With a key window, the insert and its re-check must commit together (in the caller's transaction if any);
  // so must the statements of a batch too large for one.
  if (inTx || (oneStatement && (keyWindowMs === 0 || rows.every((r) => r.key === null)))) return write(db);
  return pool.transaction((tx) => write(tx));
}

async function recentlyCompleted(db: Queryable, queries: JobQueries, type: string, rows: PreparedRow[], windowMs: number): Promise<Map<string, string>> {
  const keys = rows.flatMap((r) => (r.key === null ? [] : [r.key]));
  if (keys.length === 0) return new Map();
  const { rows: found } = await runNamed<{ id: string; dedup_key: string }>(db, queries.findRecentlyCompletedByKey, [type, keys, windowMs]);
  return new Map(found.map((r) => [r.dedup_key, r.id]));
}

function transactionEnded(what: string): TransactionEndedError {
  return new TransactionEndedError(
    `enqueue ${what}: tx is not inside a transaction (its transaction already committed or rolled back); nothing was written. Enqueue inside the transaction: before COMMIT, or within mailroom.transaction(fn)`,
  );
}

/** The xid of the transaction `db` is in (in autocommit, a new one per statement). */
async function transactionXid(db: Queryable, queries: JobQueries, what: string): Promise<string> {
  const { rows } = await runNamed<{ xid: string }>(db, queries.currentXid, []).catch((error: unknown) => {
    // PGlite's transaction object refuses on its own once the transaction is over.
    throw error instanceof Error && /transaction is closed/i.test(error.message) ? transactionEnded(what) : error;
  });
  return rows[0]!.xid;
}

function isDriver(db: Queryable): db is Driver {
  return typeof (db as Partial<Driver>).run === 'function' && typeof (db as Partial<Driver>).transaction === 'function';
}

/**
 * The smallest batch with ordering keys enqueued set-wise ({@link insertKeyed}). Below it the
 * per-row trigger costs less than the extra round trips (on the pool: BEGIN, the lock, COMMIT).
 * Measured on the pool, one caller, 100 keys: even at 64 jobs a call, 1.9 ms either way; at 1,000,
 * 13-15 ms against 23-25; at 2, 0.8 ms against 0.46.
 */
export const SET_WISE_MIN_ROWS = 64;

/**
 * A batch with ordering keys and no dedup keys: its keys locked (sorted) in one statement, then the
 * jobs inserted with their ordering seq and blocked flag computed for the whole batch in a second,
 * whose snapshot sees every job of those keys committed before the locks (migration 18). On the
 * pool the two statements run in a transaction of their own.
 */
async function insertKeyed(db: Queryable, queries: JobQueries, params: unknown[], xid: string | null): Promise<{ rows: { id: string }[] }> {
  const lockParams = [params[1], params[11]];
  if (isDriver(db)) {
    return await db.transaction(async (tx) => {
      await tx.run(queries.lockEnqueueKeys, lockParams);
      return await tx.run<{ id: string }>(queries.enqueueKeyed, [...params, null]);
    });
  }
  await runNamed(db, queries.lockEnqueueKeys, lockParams);
  return await runNamed<{ id: string }>(db, queries.enqueueKeyed, [...params, xid]);
}

/**
 * The most payload text (UTF-16 code units) one enqueue statement carries. The payloads go as one
 * `jsonb` array, which PostgreSQL caps at 256 MiB; 32 Mi code units are at most 96 MiB of UTF-8.
 * A larger batch is inserted in several statements, in one transaction.
 */
export const STATEMENT_PAYLOAD_CHARS = 32 * 1024 * 1024;

/**
 * Inserts the rows in one statement, or, when their payloads are too much for one (`oneStatement`
 * false), in runs that each fit, one after another (enqueueJobs puts them in one transaction).
 */
async function insertInStatements(
  db: Queryable,
  queries: JobQueries,
  def: JobDefinition<unknown, unknown>,
  rows: PreparedRow[],
  shared: Parameters<typeof insertRows>[4],
  oneStatement: boolean,
): Promise<string[]> {
  if (oneStatement) return insertRows(db, queries, def, rows, shared);
  const ids: string[] = [];
  for (const chunk of payloadChunks(rows)) ids.push(...(await insertRows(db, queries, def, chunk, shared)));
  return ids;
}

/** The rows split into runs whose payloads fit one statement. */
function payloadChunks(rows: PreparedRow[]): PreparedRow[][] {
  const chunks: PreparedRow[][] = [];
  let chunk: PreparedRow[] = [];
  let chars = 0;
  for (const row of rows) {
    if (chunk.length > 0 && chars + row.payload.length + 1 > STATEMENT_PAYLOAD_CHARS) {
      chunks.push(chunk);
      chunk = [];
      chars = 0;
    }
    chunk.push(row);
    chars += row.payload.length + 1;
  }
  chunks.push(chunk);
  return chunks;
}

/**
 * The rows' payloads as the text of one JSON array: each payload is already
 * JSON text (serializePayload), so joining them needs no escaping.
 */
function payloadArray(rows: PreparedRow[]): string {
  let text = '[';
  for (let i = 0; i < rows.length; i++) text += (i === 0 ? '' : ',') + rows[i]!.payload;
  return text + ']';
}

async function insertRows(
  db: Queryable,
  queries: JobQueries,
  def: JobDefinition<unknown, unknown>,
  rows: PreparedRow[],
  shared: { delayMs: number; runAt: Date | null; priority: number; correlationId: string | null; traceparent: string | null; xid: string | null; what: string },
): Promise<string[]> {
  // Many jobs with ordering keys and no dedup keys: the keys locked, then the ordering done set-wise.
  const setWise = rows.length >= SET_WISE_MIN_ROWS && rows.some((r) => r.orderingKey !== null) && rows.every((r) => r.key === null);
  // Prepared once per connection on the pool and in mailroom's own transactions; in a caller's it goes as text (runNamed).
  const insert = setWise
    ? (params: unknown[]) => insertKeyed(db, queries, params, shared.xid)
    : (params: unknown[]) =>
        runNamed<{ id: string }>(db, shared.xid === null ? queries.enqueue : queries.enqueueInTransaction, shared.xid === null ? params : [...params, shared.xid]);
  const { rows: inserted } = await insert([
    rows.map((r) => r.id),
    def.queue,
    def.name,
    shared.priority,
    shared.runAt,
    shared.delayMs,
    def.retry.maxAttempts,
    rows.map((r) => r.key),
    shared.correlationId,
    def.retry.maxAgeMs,
    payloadArray(rows),
    rows.map((r) => r.orderingKey),
    def.ordering.onDead === 'hold',
    shared.traceparent,
  ]);
  if (inserted.length === rows.length) return rows.map((r) => r.id);
  // Fewer rows: keys taken by unfinished jobs, or (with an xid) a statement outside the transaction.
  if (shared.xid !== null && (await transactionXid(db, queries, shared.what)) !== shared.xid) throw transactionEnded(shared.what);

  // Some keys were taken by unfinished jobs: answer with their ids.
  const insertedIds = new Set(inserted.map((r) => r.id));
  const skipped = rows.filter((r) => !insertedIds.has(r.id));
  const { rows: existing } = await runNamed<{ id: string; dedup_key: string }>(db, queries.findUnfinishedByKey, [
    def.name,
    skipped.map((r) => r.key),
  ]);
  const idByKey = new Map(existing.map((r) => [r.dedup_key, r.id]));
  const retry = skipped.filter((r) => !idByKey.has(r.key!));
  if (retry.length > 0) {
    // The job holding the key finished between our insert and our look-up: try again.
    const again = await insertRows(db, queries, def, retry, shared);
    retry.forEach((r, i) => idByKey.set(r.key!, again[i]!));
  }
  return rows.map((r) => (insertedIds.has(r.id) ? r.id : idByKey.get(r.key!)!));
}
