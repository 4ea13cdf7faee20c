/**
 * The options of `mailroom.transaction(fn, options)`, checked: a wrong value
 * or an unknown name is refused before anything runs.
 */
import { ValidationError } from './errors.ts';
import { checkOptionNames, type OptionNames } from './option-names.ts';
import { checkSignal } from './signal-option.ts';

/** Options of `mailroom.transaction(fn, options)`. */
export interface MailroomTransactionOptions {
  /**
   * Ends the transaction when aborted. Before COMMIT: the statement in flight
   * is cancelled on the server, the transaction rolls back, and the call
   * rejects with the signal's reason (once the cancelled statement ended); a
   * signal already aborted runs nothing. During COMMIT: the COMMIT is
   * cancelled too; one that the cancel makes fail rolls back and rejects with
   * the reason, and one waiting for a synchronous standby returns committed on
   * this server, so the call resolves. On PGlite a statement that has begun
   * runs to its end first. A rejection with the signal's reason always means
   * nothing of the transaction committed.
   */
  signal?: AbortSignal;
}

const NAMES: OptionNames<MailroomTransactionOptions> = { signal: true };

/**
 * Checks the options of `mailroom.transaction`.
 *
 * @example
 * transactionOptionsOf({ signal: AbortSignal.timeout(5_000) }) // { signal }
 */
export function transactionOptionsOf(options: unknown): MailroomTransactionOptions {
  if (options === undefined) return {};
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    throw new ValidationError(`mailroom.transaction: options must be an object such as { signal }, got ${options === null ? 'null' : Array.isArray(options) ? 'an array' : typeof options}; nothing was run`, [
      { path: '', message: 'not an object' },
    ]);
  }
  checkOptionNames(options, NAMES, 'mailroom.transaction');
  const signal = checkSignal((options as { signal?: unknown }).signal, 'mailroom.transaction');
  return signal ? { signal } : {};
}
