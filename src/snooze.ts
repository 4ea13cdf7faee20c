import { toMilliseconds, type Duration } from './duration.ts';

const SNOOZE = Symbol.for('mailroom.snooze');

/** The value `snooze(d)` returns; a handler returns it to be run again later. */
export interface Snooze {
  readonly [SNOOZE]: true;
  readonly delayMs: number;
}

/**
 * Return `snooze(duration)` from a handler to run the job again after
 * `duration` without spending an attempt (e.g. the thing it waits for is not
 * ready yet).
 *
 * @example
 * if (!report.ready) return snooze('10m');
 */
export function snooze(duration: Duration): Snooze {
  return { [SNOOZE]: true, delayMs: toMilliseconds(duration, 'snooze') };
}

/** True when a handler's return value is a {@link Snooze}. */
export function isSnooze(value: unknown): value is Snooze {
  return typeof value === 'object' && value !== null && (value as Record<symbol, unknown>)[SNOOZE] === true;
}
