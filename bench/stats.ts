/** Clocks and small statistics. */

/** Milliseconds, sub-millisecond precision, comparable between processes on this machine. */
export function now(): number {
  return performance.timeOrigin + performance.now();
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Waits for `promise` or `ms`, whichever comes first, and clears the timer (a pending one keeps the process up). */
export async function atMost(promise: Promise<unknown>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([promise, new Promise<void>((resolve) => (timer = setTimeout(resolve, ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

/** The p-th percentile (0..100) of the values, nearest-rank. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.min(sorted.length, Math.max(1, Math.ceil((p / 100) * sorted.length)));
  return sorted[rank - 1]!;
}

export function mean(values: readonly number[]): number {
  return values.length === 0 ? Number.NaN : values.reduce((a, b) => a + b, 0) / values.length;
}

/** Polls `check` every `everyMs` until it returns true or `timeoutMs` passes; returns whether it did. */
export async function waitUntil(check: () => boolean | Promise<boolean>, timeoutMs: number, everyMs = 5): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() > deadline) return false;
    await sleep(everyMs);
  }
}

/** Payloads numbered from `from`, stamped now. */
export function payloads(from: number, count: number): Array<{ i: number; t: number }> {
  const t = now();
  return Array.from({ length: count }, (_, k) => ({ i: from + k, t }));
}

/** A rate measured between two completion instants: `completions` in `seconds`. */
export interface SteadyRate {
  perSecond: number;
  /** Completions counted: those after the window's first instant, up to and including its last. */
  completions: number;
  seconds: number;
}

/**
 * Completions per second over about `window` completions after the first `skip`,
 * from `times` (completion instants in milliseconds, sorted). A worker commits
 * its completions in batches and reports each batch's jobs together, so the
 * instants come in clumps (hundreds within a fraction of a millisecond, then a
 * gap of tens of milliseconds). Counting from the `skip`-th instant to the
 * (`skip` + `window`)-th would miscount by up to a clump at each end; here both
 * ends move forward to the last instant of their clump (the next instant is
 * more than `gapMs` later), and the rate counts the completions between those
 * two instants. When the window ends in the clump it starts in, the window
 * starts at the end of the clump before; with no clump before, at `startedAt`
 * (the instant the clock started) if given.
 *
 * @example
 * steadyRate([0, 0, 10, 10, 20, 20], 1, 2).perSecond; // 200: 2 completions in (0 ms, 10 ms]
 */
export function steadyRate(times: ArrayLike<number>, skip: number, window: number, options: { gapMs?: number; startedAt?: number } = {}): SteadyRate {
  const gapMs = options.gapMs ?? 2;
  if (times.length < 1) throw new Error('steadyRate: no completion times; it needs at least 1');
  if (!(window >= 1)) throw new Error(`steadyRate: window ${window}; it must be at least 1 completion`);
  const last = times.length - 1;
  const clumpEnd = (i: number): number => {
    let j = Math.min(Math.max(0, i), last);
    while (j < last && times[j + 1]! - times[j]! <= gapMs) j++;
    return j;
  };
  const to = clumpEnd(skip + window);
  let start = clumpEnd(skip);
  let from: number;
  let completions: number;
  if (to !== start) {
    from = times[start]!;
    completions = to - start;
  } else {
    // The window ends in the clump it starts in (a short drain): count that whole clump, from the end of the one before.
    while (start > 0 && times[start]! - times[start - 1]! <= gapMs) start--;
    if (start > 0) {
      from = times[start - 1]!;
      completions = to - start + 1;
    } else if (options.startedAt !== undefined && options.startedAt < times[0]!) {
      from = options.startedAt;
      completions = to + 1;
    } else {
      throw new Error(`steadyRate: all ${times.length} completions came in one clump (no gap over ${gapMs} ms) and no earlier start was given; there is no interval to measure a rate over`);
    }
  }
  const seconds = (times[to]! - from) / 1000;
  return { perSecond: completions / seconds, completions, seconds };
}
