import type { Transaction } from '../storage/driver.ts';
import type { ClaimedRow, JobContext } from './types.ts';

/** A key a consumer group's inbox records together with the job's batched completion. */
export interface InboxKey {
  readonly group: string;
  readonly key: string;
}

/** The key under which a handler's context (made in execute.ts) carries its run. */
export const RUN_OF: unique symbol = Symbol('mailroom.jobRun');

/** The run behind a handler's context, for wrappers inside mailroom (the consumer's inbox). */
export function runOf(ctx: JobContext): JobRun | undefined {
  return (ctx as JobContext & { [RUN_OF]?: JobRun })[RUN_OF];
}

/**
 * One claimed job while this worker runs it: whether its outcome is taken,
 * and its abort state. The `AbortSignal` handed to the handler is made on
 * first use only: most handlers never read `ctx.signal`, and an
 * `AbortController` per job was a measurable part of the worker's CPU time.
 */
export class JobRun {
  /** True once an outcome was taken (recorded, or given up on abort). */
  settled = false;
  /**
   * Run in the handler's transaction before its first statement (the consumer's
   * inbox key, so a racing delivery waits for this one's commit).
   */
  txPrelude: ((tx: Transaction) => Promise<void>) | undefined = undefined;
  /** Recorded with a batched completion when the handler never opened `ctx.tx`. */
  inboxKey: InboxKey | undefined = undefined;
  private controller: AbortController | undefined;
  private abortState: { reason: unknown } | undefined;
  private abortListener: (() => void) | undefined;

  private readonly startedAt = performance.now();
  private finishedAt: number | undefined;

  constructor(readonly row: ClaimedRow) {}

  /** Marks the handler as done (the first call counts). */
  finish(): void {
    this.finishedAt ??= performance.now();
  }

  /** The handler's run time in milliseconds (until now while it still runs). */
  get durationMs(): number {
    return (this.finishedAt ?? performance.now()) - this.startedAt;
  }

  /** The signal the handler sees as `ctx.signal`. */
  get signal(): AbortSignal {
    if (!this.controller) {
      this.controller = new AbortController();
      if (this.abortState) this.controller.abort(this.abortState.reason);
    }
    return this.controller.signal;
  }

  get aborted(): boolean {
    return this.abortState !== undefined;
  }

  /** Why the run was aborted (undefined while it was not). */
  get abortReason(): unknown {
    return this.abortState?.reason;
  }

  /** Aborts the run: the handler's signal fires and the abort listener is called. Later calls do nothing. */
  abort(reason: unknown): void {
    if (this.abortState) return;
    this.abortState = { reason };
    this.controller?.abort(reason);
    const listener = this.abortListener;
    this.abortListener = undefined;
    listener?.();
  }

  /** Sets the one listener called on abort (the runner's); undefined removes it. */
  onAbort(listener: (() => void) | undefined): void {
    this.abortListener = listener;
  }
}
