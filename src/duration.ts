import { ValidationError } from './errors.ts';

/** A duration: milliseconds as a number, or a string such as `'500ms'`, `'30s'`, `'10m'`, `'2h'`, `'1d'`. */
export type Duration = number | `${number}${DurationUnit}`;
type DurationUnit = 'ms' | 's' | 'm' | 'h' | 'd';

const UNIT_MS: Record<DurationUnit, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };
const PATTERN = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$/;

/**
 * Converts a {@link Duration} to milliseconds, or throws a ValidationError
 * naming `what` when it is negative, not finite or not understood.
 *
 * @example
 * toMilliseconds('2s', 'retry.backoff.base') // 2000
 */
export function toMilliseconds(value: Duration | string, what: string): number {
  let ms: number;
  if (typeof value === 'number') {
    ms = value;
  } else {
    const match = PATTERN.exec(String(value).trim());
    if (!match) {
      throw new ValidationError(
        `${what}: ${typeof value === 'string' ? JSON.stringify(value) : typeof value} is not a duration; use milliseconds or a string like '500ms', '30s', '10m', '2h', '1d'`,
        [{ path: what, message: 'not a duration' }],
      );
    }
    ms = Number(match[1]) * UNIT_MS[match[2] as DurationUnit];
  }
  if (!Number.isFinite(ms) || ms < 0) {
    throw new ValidationError(`${what}: must be a finite duration of 0 or more, got ${String(value)}`, [
      { path: what, message: 'must be >= 0' },
    ]);
  }
  return Math.round(ms);
}
