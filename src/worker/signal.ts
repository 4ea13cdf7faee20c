import { MAX_TIMER_MS } from '../time-limit.ts';

/**
 * A change that others may wait for, with a time limit: `wait(ms)` resolves at
 * the next `fire()` or after `ms`, whichever comes first. Unlike a Waker, a
 * fire with nobody waiting is not kept: waiters look again at what they wait
 * for before they wait.
 *
 * @example
 * const roomChanged = new Signal();
 * while (room() === 0) await roomChanged.wait(1000); // elsewhere: roomChanged.fire()
 */
export class Signal {
  readonly #waiters = new Set<() => void>();

  /** Resolves at the next {@link fire}, or after `ms` (never, for `Infinity` or more than a timer holds). */
  wait(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        this.#waiters.delete(done);
        resolve();
      };
      const timer = ms <= MAX_TIMER_MS ? setTimeout(done, ms) : undefined;
      this.#waiters.add(done);
    });
  }

  /** Resolves every wait in progress. */
  fire(): void {
    if (this.#waiters.size === 0) return;
    for (const done of [...this.#waiters]) done();
  }
}
