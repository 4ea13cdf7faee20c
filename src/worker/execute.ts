import { findJob } from '../registry.ts';
import { findQueuePolicy } from './queue-policies.ts';
import { backoffDelay, resolveRetryPolicy, type RetryPolicy } from '../retry/backoff.ts';
import { defaultClassifier, JobTimeoutError, UnknownJobTypeError, type Classification, type ErrorCategory, type ErrorClassifier } from '../retry/classify.ts';
import { isSnooze } from '../snooze.ts';
import { isCancel } from '../cancel.ts';
import { RateLimitedError, RetryableError } from '../errors.ts';
import type { JobQueries } from '../jobs/queries.ts';
import type { StepQueries } from '../jobs/step-queries.ts';
import type { Driver } from '../storage/driver.ts';
import { HandlerTransaction } from './handler-tx.ts';
import { idempotencyKey, runStep } from './steps.ts';
import { advanceVersion } from '../versions.ts';
import type { ClaimedRow, Job, JobContext, JobHandler } from './types.ts';
import { RUN_OF, type JobRun } from './job-run.ts';
import { SpanStatusCode, type Span } from '@opentelemetry/api';
import { runInContext } from '../observe/context.ts';
import { startHandlerSpan, withTraceContext } from '../observe/tracing.ts';

/** What running a handler needs from its worker. */
export interface ExecutionDeps {
  driver: Driver;
  jobQueries: JobQueries;
  stepQueries: StepQueries;
  leaseMs: number;
  workerId: string;
  quotedSchema: string;
}

/** An outcome, and the handler's transaction when it used `ctx.tx`. */
export interface Execution {
  outcome: Outcome;
  tx: HandlerTransaction | undefined;
}

/** What one run of a handler decided. */
export type Outcome =
  | { kind: 'completed' }
  | { kind: 'snoozed'; delayMs: number }
  | { kind: 'cancelled'; reason: string }
  | { kind: 'rate-limited'; delayMs: number; message: string }
  | { kind: 'failed'; retry: boolean; delayMs: number; deadReason: string; category: ErrorCategory; message: string; stack: string | null }
  | { kind: 'abandoned' };

const DEFAULT_POLICY = resolveRetryPolicy(undefined, 'default');
const MAX_MESSAGE = 10_000;
const MAX_STACK = 20_000;

/** The default classifier, or a plain transient failure should even it throw (a failure must always get a decision). */
function safeDefault(error: unknown): Classification {
  try {
    return defaultClassifier(error);
  } catch {
    return { category: 'transient', retry: true };
  }
}

/** Why a handler's `RetryableError` or `RateLimitedError` had an `after` that could not be read, if it did. */
function afterProblemOf(error: unknown): string | undefined {
  return error instanceof RetryableError || error instanceof RateLimitedError ? error.afterProblem : undefined;
}

function describe(error: unknown, note?: string): { message: string; stack: string | null } {
  const noted = (message: string) => (note === undefined ? message : `${message} (${note}; the usual delay was used)`);
  if (error instanceof Error) {
    return { message: noted(error.message || error.name).slice(0, MAX_MESSAGE), stack: error.stack?.slice(0, MAX_STACK) ?? null };
  }
  let message: string;
  try {
    message = typeof error === 'string' ? error : JSON.stringify(error) ?? String(error);
  } catch {
    message = String(error);
  }
  return { message: message.slice(0, MAX_MESSAGE), stack: null };
}

/** Turns a failure into a retry decision using the job type's classifier and policy. */
export function decideFailure(row: ClaimedRow, error: unknown, random: () => number = Math.random): Extract<Outcome, { kind: 'failed' }> {
  const def = findQueuePolicy(row.queue) ?? findJob(row.type);
  const classify: ErrorClassifier = def?.classify ?? defaultClassifier;
  const policy: RetryPolicy = def?.retry ?? DEFAULT_POLICY;
  let classification: Classification;
  try {
    classification = classify(error);
  } catch {
    classification = safeDefault(error);
  }
  const { message, stack } = describe(error, afterProblemOf(error));
  const exhausted = row.attempt >= row.max_attempts;
  const retry = classification.retry && !exhausted;
  const delayMs = retry ? (classification.retryAfterMs ?? backoffDelay(policy, row.attempt, random)) : 0;
  const deadReason = classification.retry ? 'max-attempts' : classification.category;
  return { kind: 'failed', retry, delayMs, deadReason, category: classification.category, message, stack };
}

/** Builds the handler's view of a claimed row. */
export function toJob(row: ClaimedRow): Job {
  return Object.freeze({
    id: row.id,
    type: row.type,
    queue: row.queue,
    data: row.payload,
    attempt: row.attempt,
    maxAttempts: row.max_attempts,
    priority: row.priority,
    correlationId: row.correlation_id,
    createdAt: row.created_at,
  });
}

/**
 * Runs the handler for one claimed job and returns what should happen to it.
 * Never rejects. The run's signal is what the handler sees; the job's timeout
 * aborts it and counts as a `timeout` failure. An abort decides the outcome at
 * once, even if the handler ignores its signal and never settles.
 */
export function execute(run: JobRun, handler: JobHandler | undefined, deps: ExecutionDeps): Promise<Execution> {
  const { row } = run;
  let tx: HandlerTransaction | undefined;
  const ctx: JobContext & { readonly [RUN_OF]: JobRun } = {
    get signal() {
      return run.signal;
    },
    workerId: deps.workerId,
    get tx() {
      tx ??= new HandlerTransaction(deps.driver, `${row.type} ${row.id}`, deps.leaseMs, run);
      return tx.queryable;
    },
    step: (name, fn) => runStep(deps.driver, deps.stepQueries, row, name, fn, tx?.isOpen ?? false),
    idempotencyKey: (name) => idempotencyKey(row, name),
    isNewer: (entity, version) => advanceVersion(ctx.tx, deps.quotedSchema, entity, version),
    [RUN_OF]: run,
  };
  return new Promise<Execution>((resolve) => {
    let timer: NodeJS.Timeout | undefined;
    let done = false;
    let span: Span | undefined;
    const finish = (outcome: Outcome): void => {
      if (done) return;
      done = true;
      if (timer) clearTimeout(timer);
      if (span) endHandlerSpan(span, outcome);
      run.onAbort(undefined);
      resolve({ outcome, tx });
    };
    const aborted = (): Outcome => {
      const reason = run.abortReason;
      return reason instanceof JobTimeoutError ? decideFailure(row, reason) : { kind: 'abandoned' };
    };
    const threw = (error: unknown): Outcome => {
      if (run.aborted) return aborted();
      if (error instanceof RateLimitedError) {
        return { kind: 'rate-limited', delayMs: error.afterMs, message: describe(error, error.afterProblem).message };
      }
      return decideFailure(row, error);
    };
    const returned = (result: unknown): Outcome => {
      if (run.aborted) return aborted();
      if (isSnooze(result)) return { kind: 'snoozed', delayMs: result.delayMs };
      return isCancel(result) ? { kind: 'cancelled', reason: result.reason } : { kind: 'completed' };
    };
    if (!handler) {
      finish(decideFailure(row, new UnknownJobTypeError(`no handler for job type "${row.type}" in this worker; register one in worker({ handlers })`)));
      return;
    }
    run.onAbort(() => finish(aborted()));
    if (run.aborted) return finish(aborted());
    const timeoutMs = (findQueuePolicy(row.queue) ?? findJob(row.type))?.timeoutMs ?? null;
    if (timeoutMs !== null) {
      timer = setTimeout(() => run.abort(new JobTimeoutError(`job ${row.type} timed out after ${timeoutMs} ms`)), timeoutMs);
    }
    let result: unknown;
    try {
      const traced = startHandlerSpan(row.type, row.traceparent, () => ({
        'messaging.system': 'mailroom',
        'messaging.destination.name': row.queue,
        'messaging.message.id': row.id,
        'mailroom.attempt': row.attempt,
      }));
      span = traced?.span;
      const job = toJob(row);
      // AsyncLocalStorage makes every promise of the process slower on Node 20 (promise hooks), so the
      // handler runs in a context only when there is something to carry: a correlation id or a trace.
      const run =
        row.correlation_id === null
          ? () => handler(job, ctx)
          : () => runInContext({ correlationId: row.correlation_id, jobId: row.id, jobType: row.type, queue: row.queue, attempt: row.attempt }, () => handler(job, ctx));
      result = traced?.inTrace ? withTraceContext(traced.context(), run) : run();
    } catch (error) {
      return finish(threw(error));
    }
    if (isThenable(result)) result.then((value) => finish(returned(value)), (error: unknown) => finish(threw(error)));
    else finish(returned(result));
  });
}

function endHandlerSpan(span: Span, outcome: Outcome): void {
  if (!span.isRecording()) return;
  span.setAttribute('mailroom.outcome', outcome.kind);
  if (outcome.kind === 'failed') span.setStatus({ code: SpanStatusCode.ERROR, message: `${outcome.category}: ${outcome.message}` });
  span.end();
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return typeof value === 'object' && value !== null && typeof (value as { then?: unknown }).then === 'function';
}
