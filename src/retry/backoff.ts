import { toMilliseconds, type Duration } from '../duration.ts';
import { ValidationError } from '../errors.ts';

/** How long to wait before each retry: capped exponential backoff with full jitter by default. */
export interface BackoffOptions {
  /** Delay before the first retry, before jitter. Default `'1s'`. */
  base?: Duration;
  /** Upper bound for any delay. Default `'1h'`. */
  max?: Duration;
  /** Growth per attempt. Default 2. */
  multiplier?: number;
  /** `'full'` (default) picks uniformly in [0, delay]; `'none'` uses the delay as is. */
  jitter?: 'full' | 'none';
}

/** Retry policy of a job definition. */
export interface RetryOptions {
  /** Attempts in all, the first included. Default 25. */
  maxAttempts?: number;
  /** Give up (dead-letter) once the job is older than this, counted from its first enqueue. */
  maxAge?: Duration;
  backoff?: BackoffOptions;
}

/** A retry policy with every default filled in and durations in milliseconds. */
export interface RetryPolicy {
  maxAttempts: number;
  maxAgeMs: number | null;
  baseMs: number;
  maxMs: number;
  multiplier: number;
  jitter: 'full' | 'none';
}

export const DEFAULT_MAX_ATTEMPTS = 25;

/**
 * Validates retry options and fills in defaults.
 *
 * @example
 * resolveRetryPolicy({ maxAttempts: 5, backoff: { base: '2s', max: '10m' } }, 'email.welcome')
 */
export function resolveRetryPolicy(options: RetryOptions | undefined, what: string): RetryPolicy {
  const maxAttempts = options?.maxAttempts ?? DEFAULT_MAX_ATTEMPTS;
  if (!Number.isInteger(maxAttempts) || maxAttempts < 1 || maxAttempts > 1_000_000) {
    throw new ValidationError(`${what}: retry.maxAttempts must be an integer from 1 to 1000000, got ${String(maxAttempts)}`, [
      { path: 'retry.maxAttempts', message: 'must be an integer >= 1' },
    ]);
  }
  const multiplier = options?.backoff?.multiplier ?? 2;
  if (!Number.isFinite(multiplier) || multiplier < 1) {
    throw new ValidationError(`${what}: retry.backoff.multiplier must be a number >= 1, got ${String(multiplier)}`, [
      { path: 'retry.backoff.multiplier', message: 'must be >= 1' },
    ]);
  }
  const baseMs = toMilliseconds(options?.backoff?.base ?? '1s', `${what}: retry.backoff.base`);
  const maxMs = toMilliseconds(options?.backoff?.max ?? '1h', `${what}: retry.backoff.max`);
  if (maxMs < baseMs) {
    throw new ValidationError(`${what}: retry.backoff.max (${maxMs} ms) is smaller than retry.backoff.base (${baseMs} ms)`, [
      { path: 'retry.backoff.max', message: 'must be >= base' },
    ]);
  }
  const maxAgeMs = options?.maxAge === undefined ? null : toMilliseconds(options.maxAge, `${what}: retry.maxAge`);
  const jitter = options?.backoff?.jitter ?? 'full';
  if (jitter !== 'full' && jitter !== 'none') {
    throw new ValidationError(`${what}: retry.backoff.jitter must be 'full' or 'none'`, [{ path: 'retry.backoff.jitter', message: 'invalid' }]);
  }
  return { maxAttempts, maxAgeMs, baseMs, maxMs, multiplier, jitter };
}

/**
 * The delay before retrying after failed attempt number `attempt` (1-based):
 * `min(max, base * multiplier^(attempt-1))`, then full jitter unless disabled.
 * `random` is injectable so tests can pin it.
 *
 * @example
 * backoffDelay(policy, 3) // somewhere in [0, 4000] for base 1s, multiplier 2
 */
export function backoffDelay(policy: RetryPolicy, attempt: number, random: () => number = Math.random): number {
  const exponent = Math.max(0, attempt - 1);
  const raw = policy.baseMs * Math.pow(policy.multiplier, exponent);
  const capped = Math.min(policy.maxMs, Number.isFinite(raw) ? raw : policy.maxMs);
  return policy.jitter === 'full' ? Math.floor(random() * capped) : Math.floor(capped);
}
