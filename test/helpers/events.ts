import type { Worker, WorkerEvents } from '../../src/index.ts';

/**
 * Resolves when `worker` has emitted `event` `count` times (counting from now),
 * or rejects after `timeoutMs` with what it saw, so a hung test names its cause.
 */
export function waitForEvents<E extends keyof WorkerEvents>(
  worker: Worker,
  event: E,
  count: number,
  timeoutMs = 20_000,
): Promise<WorkerEvents[E][]> {
  return new Promise((resolve, reject) => {
    const seen: WorkerEvents[E][] = [];
    const listener = (...args: WorkerEvents[E]) => {
      seen.push(args);
      if (seen.length >= count) {
        cleanup();
        resolve(seen);
      }
    };
    const timer = setTimeout(() => {
      cleanup();
      reject(new Error(`timed out after ${timeoutMs} ms waiting for ${count} "${String(event)}" events; saw ${seen.length}`));
    }, timeoutMs);
    const cleanup = () => {
      clearTimeout(timer);
      (worker as unknown as { off(e: string, l: unknown): void }).off(event as string, listener);
    };
    (worker as unknown as { on(e: string, l: unknown): void }).on(event as string, listener);
  });
}

/** Polls `check` until it returns true (each try awaited), or fails after `timeoutMs`. */
export async function eventually(check: () => Promise<boolean> | boolean, timeoutMs = 20_000, what = 'condition'): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * Stops a worker's heartbeats and maintenance timers while its handlers keep
 * running: to the database the worker looks paused (as under SIGSTOP), so its
 * leases expire and can be rescued. The real SIGSTOP is in crash.test.ts.
 */
export function freezeHeartbeats(worker: Worker): void {
  (worker as unknown as { shutdownTimers(): void }).shutdownTimers();
}
