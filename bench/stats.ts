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
