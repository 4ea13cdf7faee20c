import { stopController } from '../stop-controller.ts';
import { MailroomError } from '../errors.ts';
import { endOrCut, STOP_GRACE_MS } from '../time-limit.ts';

/**
 * What a pass is told about its owner's stop: `stopped()` once the owner
 * stops (end after the current batch), and `signal` once the owner's stop
 * stopped waiting for it (its statement in flight is cancelled: pass it to
 * the driver's `run`/`query`).
 */
export interface PassControl {
  stopped(): boolean;
  readonly signal: AbortSignal;
}


/** For a pass called directly (`mailroom.maintain()`, `relay.prune()`): it runs to its end. */
export const RUN_TO_END: PassControl = { stopped: () => false, signal: new AbortController().signal };

/**
 * A background pass run every `intervalMs` (lease rescue, retention, inbox and
 * outbox pruning, statistics): one at a time (a tick while one runs is
 * skipped), told through `stopped()` once its owner stops so that it can end
 * after its current batch, and waited for by `stop()`, so that closing the
 * pool next cuts no pass off. A pass still running when `stop(limitMs)` has
 * waited `limitMs`, and at least a second (blocked on a lock another session
 * holds, say), has its statement cancelled; that is reported as an error
 * naming the pass.
 *
 * @example
 * const pruning = new PeriodicPass('inbox prune', 60_000, (pass) => inBatches(1000, 100, () => pruneBatch(pass.signal), () => pass.stopped()), report);
 * pruning.start();
 * await pruning.stop(30_000); // resolves once a pass in flight has ended, cancelled after 30 s
 */
export class PeriodicPass {
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<unknown> | undefined;
  #stopped = false;
  #abort = stopController();

  constructor(
    /** What the pass does, for the error when a stop cancels it ("retention", "inbox prune"). */
    private readonly name: string,
    private readonly intervalMs: number,
    private readonly pass: (control: PassControl) => Promise<unknown>,
    private readonly onError: (error: unknown) => void,
  ) {}

  /** Runs a pass every `intervalMs` from now on (the timer does not keep the process alive). */
  start(): void {
    this.#stopped = false;
    if (this.#abort.signal.aborted) this.#abort = stopController();
    if (this.#timer) return;
    this.#timer = setInterval(() => this.runNow(), this.intervalMs);
    this.#timer.unref();
  }

  /** Starts a pass now, unless one is running or the pass was stopped. */
  runNow(): void {
    if (this.#stopped) return;
    const control: PassControl = { stopped: () => this.#stopped, signal: this.#abort.signal };
    this.#running ??= this.pass(control)
      .catch(this.onError)
      .finally(() => (this.#running = undefined));
  }

  /**
   * Stops the timer, tells a pass in flight to end, and resolves once it has.
   * After `limitMs` (at least a second) its statement in flight is cancelled
   * (then it ends at once; it is waited for at most a second more), and the
   * error says so.
   */
  async stop(limitMs = Number.POSITIVE_INFINITY): Promise<void> {
    clearInterval(this.#timer);
    this.#timer = undefined;
    this.#stopped = true;
    const running = this.#running;
    if (!running) return;
    const waitMs = Math.max(STOP_GRACE_MS, limitMs);
    // The pass reports the abort's reason itself, as its run's failure.
    await endOrCut(running, waitMs, {
      halt: this.#abort,
      reason: new MailroomError(
        `the ${this.name} pass was cancelled: stop() waited ${Math.round(waitMs)} ms for it to end (its statement was probably waiting for a lock ` +
          'another session holds; pg_stat_activity and pg_locks show which). Its current batch was rolled back; the next pass takes it up again',
      ),
    });
  }
}
