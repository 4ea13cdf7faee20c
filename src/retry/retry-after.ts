/**
 * The `after` of `RetryableError` and `RateLimitedError`: a duration, or an
 * HTTP Retry-After header's value as it came (seconds, or a date).
 */
import { toMilliseconds, type Duration } from '../duration.ts';

/**
 * When to try again: milliseconds (a number) or a duration string (`'30s'`),
 * a Retry-After header's value as the server sent it (`'120'` is seconds,
 * `'Wed, 21 Oct 2026 07:28:00 GMT'` a date, in any of HTTP's three date
 * forms), a `Date`, or nothing (`null` or `undefined`: the header was
 * absent, the usual delay applies). Longer than a year is taken as a year.
 */
export type RetryAfter = Duration | string | Date | null | undefined;

/** What an `after` value means: a delay, nothing given, or a problem that names the bad value. */
export type ParsedRetryAfter = { ms: number | undefined; problem?: undefined } | { ms: undefined; problem: string };

const SECONDS = /^\d+$/;
/** asctime, the third HTTP-date form (RFC 9110 §5.6.7): `Sun Nov  6 08:49:37 1994`, in GMT. */
const ASCTIME = /^[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}$/;
/** The longest wait an `after` may ask for: longer is taken as this (a run time past it would not fit a timestamp for long). */
export const MAX_AFTER_MS = 366 * 24 * 3600_000;

/**
 * Reads an `after` value at `now` (a date lies that far ahead; one in the past
 * is 0). Never throws: a value it cannot read comes back as a `problem`.
 *
 * @example
 * parseRetryAfter('120', 'RetryableError.after') // { ms: 120000 }
 * parseRetryAfter(res.headers.get('retry-after'), 'RetryableError.after') // { ms: undefined } when absent
 */
export function parseRetryAfter(value: unknown, what: string, now: number = Date.now()): ParsedRetryAfter {
  const parsed = readRetryAfter(value, what, now);
  return parsed.ms !== undefined && parsed.ms > MAX_AFTER_MS ? { ms: MAX_AFTER_MS } : parsed;
}

function readRetryAfter(value: unknown, what: string, now: number): ParsedRetryAfter {
  if (value === undefined || value === null) return { ms: undefined };
  if (value instanceof Date) {
    const at = value.getTime();
    return Number.isNaN(at) ? { ms: undefined, problem: `${what}: the Date is invalid` } : { ms: Math.max(0, at - now) };
  }
  if (typeof value === 'string') {
    const text = value.trim();
    if (SECONDS.test(text)) return { ms: Number(text) * 1000 }; // Retry-After: delay-seconds
    if (/[a-z]{3},/i.test(text) || ASCTIME.test(text)) {
      const at = Date.parse(ASCTIME.test(text) ? `${text} GMT` : text); // Retry-After: HTTP-date
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
