/**
 * A background pass run every `intervalMs` (lease rescue, retention, inbox and
 * outbox pruning, statistics): one at a time (a tick while one runs is
 * skipped), told through `stopped()` once its owner stops so that it can end
 * after its current batch, and waited for by `stop()`, so that closing the
 * pool next cuts no pass off.
 *
 * @example
 * const pruning = new PeriodicPass(60_000, (stopped) => inBatches(1000, 100, pruneBatch, stopped), report);
 * pruning.start();
 * await pruning.stop(); // resolves once a pass in flight has ended
 */
export class PeriodicPass {
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<unknown> | undefined;
  #stopped = false;

  constructor(
    private readonly intervalMs: number,
    private readonly pass: (stopped: () => boolean) => Promise<unknown>,
    private readonly onError: (error: unknown) => void,
  ) {}

  /** Runs a pass every `intervalMs` from now on (the timer does not keep the process alive). */
  start(): void {
    this.#stopped = false;
    if (this.#timer) return;
    this.#timer = setInterval(() => this.runNow(), this.intervalMs);
    this.#timer.unref();
  }

  /** Starts a pass now, unless one is running or the pass was stopped. */
  runNow(): void {
    if (this.#stopped) return;
    this.#running ??= this.pass(() => this.#stopped)
      .catch(this.onError)
      .finally(() => (this.#running = undefined));
  }

  /** Stops the timer, tells a pass in flight to end, and resolves once it has. */
  async stop(): Promise<void> {
    clearInterval(this.#timer);
    this.#timer = undefined;
    this.#stopped = true;
    await this.#running;
  }
}
