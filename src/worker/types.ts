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

/** A transaction handle: run SQL with `query`, or pass it as `{ tx }` to `enqueue`. */
export interface TxHandle {
  query<R = Record<string, unknown>>(sql: string, params?: readonly unknown[]): Promise<{ rows: R[]; rowCount: number }>;
}

/** What a handler gets besides the job. */
export interface JobContext {
  /** Aborted when the job times out, the worker loses the job's lease, or a graceful stop runs out of time. */
  readonly signal: AbortSignal;
  /** Id of the worker running the job. */
  readonly workerId: string;
  /**
   * The transaction that also completes the job: work done through it commits
   * exactly when the job is recorded as completed, and only if this attempt
   * still owns the job. Opened on first use. Pass it on: `enqueue(def, data, { tx: ctx.tx })`.
   */
  readonly tx: TxHandle;
  /**
   * Runs `fn` once for this job and stores its JSON result; a retry returns the
   * stored result without calling `fn`.
   *
   * @example
   * const charge = await ctx.step('charge', () => stripe.charges.create({ ... }, { idempotencyKey: ctx.idempotencyKey('charge') }));
   */
  step<T>(name: string, fn: () => T | Promise<T>): Promise<T>;
  /** A key that is the same on every attempt of this job: `mailroom:<queue>:<job id>:<name>`. */
  idempotencyKey(name: string): string;
  /**
   * Records `version` for `entity` in `ctx.tx` and resolves true if it is newer
   * than every version recorded before; false means the update is outdated: skip it.
   *
   * @example
   * if (await ctx.isNewer(`customer:${job.data.id}`, job.data.version)) await ctx.tx.query('UPDATE customers ...');
   */
  isNewer(entity: string, version: number | bigint): Promise<boolean>;
}

/**
 * A job handler. Return (anything) to complete the job, return `snooze(d)` to
 * run it again later, throw to fail it (retried or dead-lettered by the classifier).
 */
export type JobHandler<TData = unknown> = HandlerSignature<TData>['handle'];

// A method signature compares its parameters bivariantly, so a handler written for
// Job<{ userId: string }> fits the handlers map, and an inline one gets Job<unknown>.
interface HandlerSignature<TData> {
  handle(job: Job<TData>, ctx: JobContext): unknown;
}

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
  /** W3C trace context the job was enqueued in (or its event carried). */
  traceparent: string | null;
  expires_at: Date | null;
  /** The job's ordering key, if it has one. */
  ordering_key: string | null;
  /** Its place among the key's jobs (a bigint as text), if it has a key. */
  ordering_seq: string | null;
  /** True for a follower: claimed behind its key's head, to run only after the job before it completed. */
  blocked: boolean;
}
