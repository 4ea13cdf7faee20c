/**
 * The `after` of `RetryableError` and `RateLimitedError`: a duration, or an
 * HTTP Retry-After header's value as it came (seconds, or a date).
 */
import { toMilliseconds, type Duration } from '../duration.ts';

/**
 * When to try again: milliseconds (a number) or a duration string (`'30s'`),
 * a Retry-After header's value as the server sent it (`'120'` is seconds,
 * `'Wed, 21 Oct 2026 07:28:00 GMT'` a date), a `Date`, or nothing (`null`
 * or `undefined`: the header was absent, the usual delay applies).
 */
export type RetryAfter = Duration | string | Date | null | undefined;

/** What an `after` value means: a delay, nothing given, or a problem that names the bad value. */
export type ParsedRetryAfter = { ms: number | undefined; problem?: undefined } | { ms: undefined; problem: string };

const SECONDS = /^\d+$/;

/**
 * Reads an `after` value at `now` (a date lies that far ahead; one in the past
 * is 0). Never throws: a value it cannot read comes back as a `problem`.
 *
 * @example
 * parseRetryAfter('120', 'RetryableError.after') // { ms: 120000 }
 * parseRetryAfter(res.headers.get('retry-after'), 'RetryableError.after') // { ms: undefined } when absent
 */
export function parseRetryAfter(value: unknown, what: string, now: number = Date.now()): ParsedRetryAfter {
  if (value === undefined || value === null) return { ms: undefined };
  if (value instanceof Date) {
    const at = value.getTime();
    return Number.isNaN(at) ? { ms: undefined, problem: `${what}: the Date is invalid` } : { ms: Math.max(0, at - now) };
  }
  if (typeof value === 'string') {
    const text = value.trim();
    if (SECONDS.test(text)) return { ms: Number(text) * 1000 }; // Retry-After: delay-seconds
    if (/[a-z]{3},/i.test(text)) {
      const at = Date.parse(text); // Retry-After: HTTP-date
      if (!Number.isNaN(at)) return { ms: Math.max(0, at - now) };
    }
  }
  if (typeof value !== 'string' && typeof value !== 'number') return { ms: undefined, problem: `${what}: expected a duration, a Retry-After value or a Date, got ${typeof value}` };
  try {
    return { ms: toMilliseconds(value as Duration, what) };
  } catch {
    return {
      ms: undefined,
      problem: `${what}: ${JSON.stringify(value)} is neither a duration (milliseconds, '30s') nor a Retry-After value (seconds such as '120', or an HTTP date)`,
    };
  }
}
