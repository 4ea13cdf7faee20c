import { ValidationError } from './errors.ts';

/**
 * Checks a `signal` option: undefined, or an AbortSignal. `what` names the
 * call in the error (`mailroom.transaction`, `enqueue job x`); `inTx` refuses
 * a signal beside a `tx`, whose transaction belongs to the caller.
 *
 * @example
 * const signal = checkSignal(options.signal, 'publish order.created', options.tx !== undefined);
 */
export function checkSignal(value: unknown, what: string, inTx = false): AbortSignal | undefined {
  if (value === undefined) return undefined;
  if (!(value instanceof AbortSignal)) {
    throw new ValidationError(`${what}: signal must be an AbortSignal (from new AbortController() or AbortSignal.timeout(ms)), got ${value === null ? 'null' : typeof value}; nothing was run`, [
      { path: 'signal', message: 'not an AbortSignal' },
    ]);
  }
  if (inTx) {
    throw new ValidationError(
      `${what}: signal was given with tx; the transaction is yours, so it ends with your signal: give the signal to mailroom.transaction(fn, { signal }) (or cancel your own transaction) and leave it out here. Nothing was written`,
      [{ path: 'signal', message: 'given with tx' }],
    );
  }
  return value;
}
