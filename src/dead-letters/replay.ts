/**
 * Replaying and discarding dead letters by filter: in small transactions, each
 * changing only jobs that are still dead (so a job is acted on at most once
 * per call, and a second call picks up what an interrupted one left),
 * rate-limited, interruptible with an AbortSignal, and recorded (one row per
 * call in `dead_letter_replays`, one link per job acted on).
 */
import { hostname, userInfo } from 'node:os';
import { setImmediate as yieldToEventLoop, setTimeout as sleep } from 'node:timers/promises';
import { ValidationError } from '../errors.ts';
import { newId } from '../ids.ts';
import { registeredJobs } from '../registry.ts';
import type { Driver } from '../storage/driver.ts';
import type { DeadLetterQueries } from './dead-letter-queries.ts';
import { filterParams, requireCriterion, resolveFilter, type DeadLetterFilter, type ResolvedFilter } from './filter.ts';
import { runReport } from '../storage/report-query.ts';

/** Progress of a replay or discard, reported after each committed batch. */
export interface DeadLetterProgress {
  action: 'replay' | 'discard';
  replayId: string;
  /** Dead letters the filter selected when the call began (at most `limit`). */
  matched: number;
  /** Jobs replayed (or discarded) so far, all committed. */
  done: number;
}

/** Options of `deadLetters.discard`. */
export interface DiscardOptions {
  /** Change nothing; report how many match (the call is still recorded, as a dry run). */
  dryRun?: boolean;
  /** Abort to stop after the current batch; nothing is lost or done twice (`interrupted: true`). */
  signal?: AbortSignal;
  /** Called after each committed batch. */
  onProgress?: (progress: DeadLetterProgress) => void;
  /** Who is doing it, for the record. Default `user@host` of this process. */
  by?: string;
}

/** Options of `deadLetters.replay`. */
export interface ReplayOptions extends DiscardOptions {
  /** At most this many jobs per second. Default: no limit (batches of 500). */
  ratePerSecond?: number;
  /** Replay at most this many (the oldest deaths first). */
  limit?: number;
}

/** What a replay did. */
export interface ReplayResult {
  /** Dead letters the filter selected when the call began (at most `limit`). */
  matched: number;
  /** Jobs put back to `available` (0 for a dry run). */
  replayed: number;
  /** The record of this call in `dead_letter_replays` (and in the replayed jobs' history). */
  replayId: string;
  /** Ids the filter named that are not dead letters (no such job, or not dead): only when `ids` was given. */
  notFound?: string[];
  /** Matched dead letters left dead because an unfinished job holds their dedup key now. */
  skipped: number;
  dryRun: boolean;
  /** True when the signal stopped it before the end; run it again to do the rest. */
  interrupted: boolean;
}

/** What a discard did. */
export interface DiscardResult {
  matched: number;
  /** Jobs moved from `dead` to `cancelled` (0 for a dry run). */
  discarded: number;
  replayId: string;
  notFound?: string[];
  dryRun: boolean;
  interrupted: boolean;
}

/** What replaying and discarding need. */
export interface BulkDeps {
  driver: Driver;
  queries: DeadLetterQueries;
  /** The NOTIFY channel that wakes workers (`<schema>_wakeup`). */
  wakeChannel: string;
}

const UNLIMITED_BATCH = 500;
const MAX_RATE = 100_000;

interface CheckedOptions {
  dryRun: boolean;
  signal: AbortSignal | undefined;
  onProgress: ((progress: DeadLetterProgress) => void) | undefined;
  by: string;
  rate: number | null;
  limit: number | null;
}

function optionError(action: string, field: string, message: string): ValidationError {
  return new ValidationError(`dead-letter ${action}: ${field} ${message}`, [{ path: field, message }]);
}

/** The default `by`: `user@host` of this process (or just the host when the user is unknown). */
export function defaultActor(): string {
  try {
    return `${userInfo().username}@${hostname()}`;
  } catch {
    return hostname();
  }
}

function checkOptions(options: unknown, action: 'replay' | 'discard'): CheckedOptions {
  if (options === undefined || options === null) options = {};
  if (typeof options !== 'object' || Array.isArray(options)) throw optionError(action, 'options', 'must be an object');
  const o = options as Record<string, unknown>;
  const known = action === 'replay' ? ['dryRun', 'signal', 'onProgress', 'by', 'ratePerSecond', 'limit'] : ['dryRun', 'signal', 'onProgress', 'by'];
  for (const key of Object.keys(o)) {
    if (!known.includes(key)) throw optionError(action, key, `is not an option of ${action}; the options are ${known.join(', ')}`);
  }
  if (o.dryRun !== undefined && typeof o.dryRun !== 'boolean') throw optionError(action, 'dryRun', 'must be true or false');
  if (o.signal !== undefined && !(o.signal instanceof AbortSignal)) throw optionError(action, 'signal', 'must be an AbortSignal (e.g. from new AbortController())');
  if (o.onProgress !== undefined && typeof o.onProgress !== 'function') throw optionError(action, 'onProgress', 'must be a function');
  if (o.by !== undefined && (typeof o.by !== 'string' || o.by.trim() === '' || o.by.length > 200)) {
    throw optionError(action, 'by', 'must be a non-empty string of at most 200 characters naming who acts (e.g. alice@ops)');
  }
  const rate = o.ratePerSecond;
  if (rate !== undefined && (typeof rate !== 'number' || !Number.isFinite(rate) || rate <= 0 || rate > MAX_RATE)) {
    throw optionError(action, 'ratePerSecond', `must be a number above 0 and at most ${MAX_RATE} (jobs per second), got ${JSON.stringify(rate)}; leave it out for no limit`);
  }
  const limit = o.limit;
  if (limit !== undefined && (typeof limit !== 'number' || !Number.isSafeInteger(limit) || limit < 1)) {
    throw optionError(action, 'limit', `must be a whole number of 1 or more, got ${JSON.stringify(limit)}`);
  }
  return {
    dryRun: o.dryRun === true,
    signal: o.signal as AbortSignal | undefined,
    onProgress: o.onProgress as CheckedOptions['onProgress'],
    by: (o.by as string | undefined) ?? defaultActor(),
    rate: (rate as number | undefined) ?? null,
    limit: (limit as number | undefined) ?? null,
  };
}

/** Waits until `at` (performance.now() time); false when the signal aborted the wait. */
async function waitUntil(at: number, signal: AbortSignal | undefined): Promise<boolean> {
  const ms = at - performance.now();
  if (ms <= 0) return !signal?.aborted;
  try {
    await sleep(ms, undefined, signal ? { signal } : {});
    return true;
  } catch {
    return false;
  }
}

interface BulkOutcome {
  matched: number;
  done: number;
  replayId: string;
  notFound: string[] | undefined;
  keyHeld: number;
  dryRun: boolean;
  interrupted: boolean;
}

async function runBulk(deps: BulkDeps, action: 'replay' | 'discard', filterInput: unknown, optionsInput: unknown): Promise<BulkOutcome> {
  const filter: ResolvedFilter = resolveFilter(filterInput);
  requireCriterion(filter, action);
  const options = checkOptions(optionsInput, action);
  const { driver, queries } = deps;
  const params = filterParams(filter);
  const { rows: counts } = await runReport<{ matched: number; key_held: number }>(driver, queries.count, params);
  const total = counts[0]?.matched ?? 0;
  const matched = options.limit === null ? total : Math.min(total, options.limit);
  let notFound: string[] | undefined;
  if (filter.ids) {
    const { rows } = await driver.run<{ id: string }>(queries.matchIds, params);
    const found = new Set(rows.map((r) => r.id));
    notFound = filter.ids.filter((id) => !found.has(id));
  }
  const keyHeld = action === 'replay' ? (counts[0]?.key_held ?? 0) : 0;
  const replayId = newId();
  await driver.run(queries.startRecord, [replayId, action, JSON.stringify(filter.asRecorded), matched, options.dryRun, options.by]);
  const outcome: BulkOutcome = { matched, done: 0, replayId, notFound, keyHeld, dryRun: options.dryRun, interrupted: false };
  if (options.dryRun) return outcome;

  const definitions = [...registeredJobs()];
  const budgetParams = [definitions.map((d) => d.name), definitions.map((d) => d.retry.maxAttempts)];
  const batchSize = options.rate === null ? UNLIMITED_BATCH : Math.max(1, Math.min(UNLIMITED_BATCH, Math.ceil(options.rate / 10)));
  const started = performance.now();
  let finished = false;
  try {
    for (;;) {
      // Let timers and signal handlers run between batches (the embedded database answers through
      // promises alone, so a replay that is behind its rate would otherwise never yield to them).
      await yieldToEventLoop();
      if (options.signal?.aborted) {
        outcome.interrupted = true;
        break;
      }
      const size = options.limit === null ? batchSize : Math.min(batchSize, options.limit - outcome.done);
      if (size <= 0) break;
      // Pacing: job n (counting from 0) goes no earlier than n / rate seconds after the start.
      if (options.rate !== null && !(await waitUntil(started + ((outcome.done + size - 1) / options.rate) * 1000, options.signal))) {
        outcome.interrupted = true;
        break;
      }
      const statement = action === 'replay' ? queries.replayBatch : queries.discardBatch;
      const batchParams = [...params, replayId, size, ...(action === 'replay' ? budgetParams : [])];
      const changed = await driver.transaction(
        async (tx) => {
          const { rows } = await tx.run<{ id: string; queue: string }>(statement, batchParams);
          if (action === 'replay' && rows.length > 0) await tx.run(queries.wake, [deps.wakeChannel, [...new Set(rows.map((r) => r.queue))]]);
          return rows.length;
        },
        { jit: false }, // priced high for its per-job dedup-key probes (see runReport)
      );
      outcome.done += changed;
      if (changed > 0) options.onProgress?.({ action, replayId, matched, done: outcome.done });
      if (changed < size) break;
    }
    finished = true;
  } finally {
    // Also when a batch or onProgress threw: the record says how far it got (its count is exact either way).
    await driver.run(queries.finishRecord, [replayId, outcome.interrupted || !finished]).catch((error) => {
      if (finished) throw error;
    });
  }
  return outcome;
}

/**
 * Puts dead letters matching `filter` back to `available`, in place (same id,
 * errors and history kept), with a fresh budget of attempts and of maxAge.
 *
 * @example
 * const { matched, replayed, replayId } = await replayDeadLetters(deps, { queue: 'email', category: 'transient' }, { ratePerSecond: 10 });
 */
export async function replayDeadLetters(deps: BulkDeps, filter: DeadLetterFilter, options?: ReplayOptions): Promise<ReplayResult> {
  const o = await runBulk(deps, 'replay', filter, options);
  return {
    matched: o.matched,
    replayed: o.done,
    replayId: o.replayId,
    ...(o.notFound ? { notFound: o.notFound } : {}),
    skipped: o.keyHeld,
    dryRun: o.dryRun,
    interrupted: o.interrupted,
  };
}

/**
 * Discards dead letters matching `filter`: `dead` → `cancelled` (as `jobs.cancel`),
 * so a job that held its ordering key lets the next job of the key run.
 *
 * @example
 * const { discarded } = await discardDeadLetters(deps, { type: 'mailroom.invalid-message', until: '7d' });
 */
export async function discardDeadLetters(deps: BulkDeps, filter: DeadLetterFilter, options?: DiscardOptions): Promise<DiscardResult> {
  const o = await runBulk(deps, 'discard', filter, options);
  return {
    matched: o.matched,
    discarded: o.done,
    replayId: o.replayId,
    ...(o.notFound ? { notFound: o.notFound } : {}),
    dryRun: o.dryRun,
    interrupted: o.interrupted,
  };
}
