import { toMilliseconds, type Duration } from '../duration.ts';
import { ValidationError } from '../errors.ts';
import { checkOptionNames, type OptionNames } from '../option-names.ts';
import { STALL_CHECK, type StallCheck } from './stalled-statements.ts';

/**
 * When mailroom gives up on a PostgreSQL connection that stopped answering
 * (docs/STORAGE.md, "Connections that stop answering"). `false` switches the
 * check off: statements wait for as long as the operating system keeps the
 * connection (about 15 minutes on Linux).
 */
export interface StallCheckOptions {
  /** A statement unanswered this long is looked up on the server. Default `'15s'`. */
  after?: Duration;
  /** How often unanswered statements are gone through. Default `'5s'`. */
  every?: Duration;
  /** The look's own time limit (connecting included), and the limit on a new connection's first statement. Default `'10s'`. */
  answer?: Duration;
}

const STALL_CHECK_OPTION_NAMES: OptionNames<StallCheckOptions> = { after: true, every: true, answer: true };

/** The check that never gives up on a statement (`stallCheck: false`). */
const NO_STALL_CHECK: StallCheck = { afterMs: Number.POSITIVE_INFINITY, everyMs: STALL_CHECK.everyMs, answerMs: Number.POSITIVE_INFINITY };

/**
 * The stall check `createMailroom({ stallCheck })` asks for, checked: each
 * time a duration above 0; unknown keys refused.
 *
 * @example
 * resolveStallCheck({ after: '5s' }) // { afterMs: 5000, everyMs: 5000, answerMs: 10000 }
 */
export function resolveStallCheck(option: StallCheckOptions | false | undefined): StallCheck {
  if (option === undefined) return STALL_CHECK;
  if (option === false) return NO_STALL_CHECK;
  if (typeof option !== 'object' || option === null || Array.isArray(option)) {
    throw new ValidationError(`stallCheck: expected { after, every, answer } (durations) or false, got ${option === null ? 'null' : Array.isArray(option) ? 'an array' : typeof option}`, [
      { path: 'stallCheck', message: 'invalid' },
    ]);
  }
  checkOptionNames(option, STALL_CHECK_OPTION_NAMES, 'stallCheck');
  const ms = (key: keyof StallCheckOptions, fallback: number): number => {
    const value = option[key];
    if (value === undefined) return fallback;
    const resolved = toMilliseconds(value, `stallCheck.${key}`);
    if (resolved === 0) {
      throw new ValidationError(`stallCheck.${key}: must be above 0, got ${String(value)}; to switch the check off, pass stallCheck: false`, [{ path: `stallCheck.${key}`, message: 'must be > 0' }]);
    }
    return resolved;
  };
  return { afterMs: ms('after', STALL_CHECK.afterMs), everyMs: ms('every', STALL_CHECK.everyMs), answerMs: ms('answer', STALL_CHECK.answerMs) };
}
