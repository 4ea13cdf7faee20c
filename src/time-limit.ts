/** The longest delay setTimeout keeps: a longer one fires at once. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * The least a stop gives work it waits for past its timeout (a background
 * pass, a relay's round, a worker's writes, a release): work that merely runs
 * is not cut off by a short timeout; what is still waiting then is cancelled.
 */
export const STOP_GRACE_MS = 1000;

/**
 * `promise`'s value if it settles within `ms`, else `fallback` (a later
 * outcome is ignored; `promise` must not reject). No time limit for `ms` past
 * what a timer holds (`Infinity` included).
 *
 * @example
 * const answered = await within(client.query('SELECT 1').then(() => true, () => false), 10_000, false);
 */
export async function within<T>(promise: Promise<T>, ms: number, fallback: T): Promise<T> {
  if (ms > MAX_TIMER_MS) return promise;
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<T>((resolve) => {
    timer = setTimeout(() => resolve(fallback), Math.max(0, ms));
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * `promise`'s outcome, or a rejection with `signal`'s reason as soon as it
 * aborts (already aborted: at once). A later outcome of `promise` is ignored,
 * its rejection included.
 *
 * @example
 * await unlessAborted(target.publish(events, context), stopping.signal);
 */
export async function unlessAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  promise.catch(() => {});
  signal.throwIfAborted();
  let onAbort: (() => void) | undefined;
  const aborted = new Promise<never>((_, reject) => {
    onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
  });
  try {
    return await Promise.race([promise, aborted]);
  } finally {
    signal.removeEventListener('abort', onAbort!);
  }
}

/** How long a stop that cancelled a statement waits for it to end on the server (its lock wait with it) before it goes on anyway. */
export const CANCEL_WAIT_MS = 500;

/**
 * What is left until `deadline` (ms since the epoch), but at least
 * STOP_GRACE_MS: the time a stop gives each step after its main wait.
 *
 * @example
 * await target.close(graceLeft(deadline));
 */
export function graceLeft(deadline: number): number {
  return Math.max(STOP_GRACE_MS, deadline - Date.now());
}

/**
 * Waits for `work` (which must not reject) for `waitMs`. If it has not ended
 * by then, aborts `halt` with `reason`, calls `onCut`, and gives the cancelled
 * work at most STOP_GRACE_MS more to unwind.
 *
 * @example
 * await endOrCut(drained, 5_000, { halt, reason: new Error('stopped'), onCut: () => report(cutShortError) });
 */
export async function endOrCut(
  work: Promise<unknown>,
  waitMs: number,
  cut: { halt: AbortController; reason: Error; onCut?: () => void },
): Promise<void> {
  if (await within(work.then(() => true), waitMs, false)) return;
  cut.halt.abort(cut.reason);
  cut.onCut?.();
  await within(work.then(() => undefined), STOP_GRACE_MS, undefined);
}
