import { toMilliseconds, type Duration } from './duration.ts';
import { ValidationError } from './errors.ts';
import type { RetentionQueries } from './jobs/retention-queries.ts';
import type { Driver } from './storage/driver.ts';
import { inBatches } from './storage/batches.ts';
import { RUN_TO_END, type PassControl } from './storage/periodic-pass.ts';
import type { JobDefinition } from './define.ts';

/** How long finished jobs are kept. */
export interface RetentionOptions {
  /** Completed and cancelled jobs: by age (default `'7d'`) and/or newest `count` per queue. */
  completed?: { age?: Duration; count?: number };
  /** Dead jobs (the dead-letter queue): by age. Default `'14d'`. */
  dead?: { age?: Duration };
  /**
   * How long the deduplication key of a completed job keeps deduplicating (a
   * redelivered request enqueuing again gets the completed job's id). Default 0:
   * a key is free again once its job finishes. When set, it must cover every
   * job type's retry horizon, and completed jobs are kept at least this long.
   */
  dedupKeys?: Duration;
  /** Rows deleted per statement. Default 1000. */
  batchSize?: number;
  /** How often workers prune. Default `'1m'`. */
  interval?: Duration;
}

/** Retention with defaults filled in, in milliseconds. */
export interface RetentionPolicy {
  completedAgeMs: number;
  completedCount: number | null;
  deadAgeMs: number;
  dedupKeysMs: number;
  batchSize: number;
  intervalMs: number;
}

const MAX_BATCHES_PER_PASS = 100;

/** Validates retention options and fills in defaults. */
export function resolveRetention(options: RetentionOptions | undefined): RetentionPolicy {
  const count = options?.completed?.count;
  if (count !== undefined && (!Number.isInteger(count) || count < 0)) {
    throw new ValidationError(`retention.completed.count must be an integer of 0 or more, got ${String(count)}`, [
      { path: 'retention.completed.count', message: 'invalid' },
    ]);
  }
  const batchSize = options?.batchSize ?? 1000;
  if (!Number.isInteger(batchSize) || batchSize < 1 || batchSize > 100_000) {
    throw new ValidationError(`retention.batchSize must be an integer from 1 to 100000, got ${String(batchSize)}`, [
      { path: 'retention.batchSize', message: 'invalid' },
    ]);
  }
  const completedAgeMs = toMilliseconds(options?.completed?.age ?? '7d', 'retention.completed.age');
  const dedupKeysMs = toMilliseconds(options?.dedupKeys ?? 0, 'retention.dedupKeys');
  if (dedupKeysMs > completedAgeMs) {
    throw new ValidationError(
      `retention.completed.age (${completedAgeMs} ms) is shorter than retention.dedupKeys (${dedupKeysMs} ms): completed jobs carry their keys, so keep them at least as long`,
      [{ path: 'retention.completed.age', message: 'shorter than dedupKeys' }],
    );
  }
  return {
    dedupKeysMs,
    completedAgeMs,
    completedCount: count ?? null,
    deadAgeMs: toMilliseconds(options?.dead?.age ?? '14d', 'retention.dead.age'),
    batchSize,
    intervalMs: Math.max(1000, toMilliseconds(options?.interval ?? '1m', 'retention.interval')),
  };
}

/**
 * The longest a job of this type can stay unfinished because of retries: its
 * `maxAge` (plus one run of its timeout: an attempt started just before the
 * age ran out), or else the sum of its largest possible backoff delays and of
 * its runs, each up to its `timeout`. Without a timeout a run's own length is
 * not bounded and not counted.
 *
 * @example
 * retryHorizonMs({ retry: resolveRetryPolicy({ maxAttempts: 3 }, 'x'), timeoutMs: 60_000 }) // 1 s + 2 s of backoff + 3 runs of 60 s
 */
export function retryHorizonMs(def: Pick<JobDefinition<unknown, unknown>, 'retry'> & { timeoutMs?: number | null }): number {
  const runMs = def.timeoutMs ?? 0;
  if (def.retry.maxAgeMs !== null) return def.retry.maxAgeMs + runMs;
  let total = runMs * def.retry.maxAttempts;
  for (let attempt = 1; attempt < def.retry.maxAttempts; attempt++) {
    total += Math.min(def.retry.maxMs, def.retry.baseMs * Math.pow(def.retry.multiplier, attempt - 1));
    if (!Number.isFinite(total)) return Number.POSITIVE_INFINITY;
  }
  return total;
}

/**
 * Refuses a dead-letter retention shorter than a job type's retry horizon: a
 * dead letter must outlive the window in which its job could still have been
 * retried, so that the history and keys of what failed are there to be seen.
 */
export function checkRetentionAgainst(policy: RetentionPolicy, definitions: Iterable<JobDefinition<unknown, unknown>>): void {
  for (const def of definitions) {
    const horizon = retryHorizonMs(def);
    if (policy.dedupKeysMs > 0 && policy.dedupKeysMs < horizon) {
      throw new ValidationError(
        `retention.dedupKeys (${policy.dedupKeysMs} ms) is shorter than the retry horizon of job ${def.name} (${horizon} ms): a redelivery arriving while that job could still be retrying would not be caught; raise dedupKeys or shorten the job's retries`,
        [{ path: 'retention.dedupKeys', message: 'shorter than a retry horizon' }],
      );
    }
    if (policy.deadAgeMs < horizon) {
      throw new ValidationError(
        `retention.dead.age (${policy.deadAgeMs} ms) is shorter than the retry horizon of job ${def.name} (${horizon} ms: ${def.retry.maxAttempts} attempts, backoff up to ${def.retry.maxMs} ms${def.retry.maxAgeMs !== null ? `, maxAge ${def.retry.maxAgeMs} ms` : ''}${def.timeoutMs !== null ? `, runs of up to ${def.timeoutMs} ms` : ''}); keep dead jobs longer or shorten that job's retries`,
      [{ path: 'retention.dead.age', message: 'shorter than a retry horizon' }],
      );
    }
  }
}

/** One retention pass, in bounded batches (none begun once `pass.stopped()`; its statement cancelled by `pass.signal`); returns how many jobs it deleted. */
export async function prune(driver: Driver, queries: RetentionQueries, policy: RetentionPolicy, pass: PassControl = RUN_TO_END): Promise<number> {
  let deleted = 0;
  const { signal } = pass;
  const drain = async (run: () => Promise<{ rowCount: number }>) => {
    deleted += await inBatches(policy.batchSize, MAX_BATCHES_PER_PASS, run, () => pass.stopped());
  };
  await drain(() => driver.run(queries.pruneByAge, [['completed', 'cancelled'], policy.completedAgeMs, policy.batchSize], { signal }));
  await drain(() => driver.run(queries.pruneByAge, [['dead'], policy.deadAgeMs, policy.batchSize], { signal }));
  if (policy.completedCount !== null) {
    const { rows } = await driver.run<{ queue: string; finished_at: string; id: string }>(queries.completedCutoffs, [policy.completedCount], { signal });
    if (rows.length > 0) {
      const cutoffs = [rows.map((r) => r.queue), rows.map((r) => r.finished_at), rows.map((r) => r.id)];
      await drain(() => driver.run(queries.pruneCompletedBeyond, [...cutoffs, policy.batchSize], { signal }));
    }
  }
  if (!pass.stopped()) await driver.run(queries.pruneIdleOrderingKeys, [policy.batchSize], { signal });
  return deleted;
}
