/** A claimed job as a handler sees it. */
export interface Job<TData = unknown> {
  readonly id: string;
  readonly type: string;
  readonly queue: string;
  readonly data: TData;
  /** 1 on the first run, 2 on the first retry, ... */
  readonly attempt: number;
  readonly maxAttempts: number;
  readonly priority: number;
  readonly correlationId: string | null;
  readonly createdAt: Date;
}

/** What a handler gets besides the job. */
export interface JobContext {
  /** Aborted when the job times out, the worker loses the job's lease, or a graceful stop runs out of time. */
  readonly signal: AbortSignal;
  /** Id of the worker running the job. */
  readonly workerId: string;
}

/**
 * A job handler. Return (anything) to complete the job, return `snooze(d)` to
 * run it again later, throw to fail it (retried or dead-lettered by the classifier).
 */
export type JobHandler<TData = unknown> = (job: Job<TData>, ctx: JobContext) => unknown;

/** A row returned by the claim statement. */
export interface ClaimedRow {
  id: string;
  queue: string;
  type: string;
  payload: unknown;
  attempt: number;
  max_attempts: number;
  claim_count: number;
  priority: number;
  correlation_id: string | null;
  created_at: Date;
  expires_at: Date | null;
}
