/**
 * A loop's sleep that a NOTIFY, a finished job or a stop can cut short. A poke
 * that comes while nobody sleeps is kept: the next sleep returns at once, so a
 * wake-up between two sleeps is never lost. Used by workers and relays.
 */
export class Waker {
  private woken = false;
  private wake: (() => void) | undefined;

  /** Ends the current sleep now, or the next one at once. */
  poke(): void {
    this.woken = true;
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  /** Resolves after `ms`, or at the first poke (one that came before this call counts). */
  sleep(ms: number): Promise<void> {
    if (this.woken) {
      this.woken = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.wake = undefined;
        resolve();
      }, ms);
      this.wake = () => {
        clearTimeout(timer);
        this.woken = false;
        resolve();
      };
    });
  }
}
