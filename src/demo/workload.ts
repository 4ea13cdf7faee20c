/**
 * The demo's workload: a small online shop's background jobs. Most succeed,
 * some are flaky (the warehouse API drops the connection a couple of times),
 * and a few are poison: a declined card (PermanentError), a partner API that
 * is down for good (exhausts maxAttempts) and a job type no worker handles.
 */
import { defineJob } from '../define.ts';
import { PermanentError } from '../errors.ts';
import type { Job, JobContext, JobHandler } from '../worker/types.ts';

/** The queue every demo job goes to. */
export const DEMO_QUEUE = 'demo';

/** The kinds of demo job, by how they should end. */
export type DemoKind = 'ok' | 'flaky' | 'permanent' | 'exhausted' | 'unknown';

/** Attempts before a flaky job succeeds. */
export const FLAKY_FAILURES = 2;
/** maxAttempts of the job that always fails. */
export const EXHAUSTED_ATTEMPTS = 3;

const quickRetry = { maxAttempts: 10, backoff: { base: '50ms', max: '500ms' } } as const;

/** The job definitions, one per kind. Both the demo and its worker processes import them. */
export const demoJobs = {
  ok: defineJob<{ order: number }>('demo.send-receipt', { queue: DEMO_QUEUE, retry: quickRetry }),
  flaky: defineJob<{ order: number; failures: number }>('demo.sync-inventory', { queue: DEMO_QUEUE, retry: quickRetry }),
  permanent: defineJob<{ order: number }>('demo.charge-card', { queue: DEMO_QUEUE, retry: quickRetry }),
  exhausted: defineJob<{ order: number }>('demo.notify-partner', {
    queue: DEMO_QUEUE,
    retry: { maxAttempts: EXHAUSTED_ATTEMPTS, backoff: { base: '50ms', max: '200ms' } },
  }),
  // No worker registers a handler for this type: it is dead-lettered as 'unknown-type'.
  unknown: defineJob<{ order: number }>('demo.legacy-export', { queue: DEMO_QUEUE, retry: quickRetry }),
} as const;

/** How each kind should end: its final state and, for dead letters, the reason. */
export const EXPECTED_OUTCOME: Record<DemoKind, { state: 'completed' | 'dead'; deadReason: string | null; story: string }> = {
  ok: { state: 'completed', deadReason: null, story: 'send a receipt' },
  flaky: { state: 'completed', deadReason: null, story: `sync stock; the warehouse API fails ${FLAKY_FAILURES} times, then works` },
  permanent: { state: 'dead', deadReason: 'permanent', story: 'charge a card that is declined (PermanentError)' },
  exhausted: { state: 'dead', deadReason: 'max-attempts', story: `notify a partner whose API is down for good (${EXHAUSTED_ATTEMPTS} attempts)` },
  unknown: { state: 'dead', deadReason: 'unknown-type', story: 'a job type no worker has a handler for' },
};

/** How many jobs of each kind a run of `total` jobs enqueues. */
export function planWorkload(total: number): Record<DemoKind, number> {
  const unknown = 1;
  const permanent = 3;
  const exhausted = 3;
  const flaky = Math.max(1, Math.round(total * 0.1));
  const ok = total - unknown - permanent - exhausted - flaky;
  if (ok < 1) throw new RangeError(`the demo needs at least 20 jobs, got ${total}`);
  return { ok, flaky, permanent, exhausted, unknown };
}

/** The job order of a run: kinds spread through the run so the poison jobs do not all come last. */
export function workloadOrder(plan: Record<DemoKind, number>): DemoKind[] {
  const total = Object.values(plan).reduce((a, b) => a + b, 0);
  const order: (DemoKind | undefined)[] = new Array(total);
  const spread = (kind: DemoKind, count: number, offset: number) => {
    for (let i = 0; i < count; i++) {
      let at = Math.floor(((i + offset) * total) / (count + 1)) % total;
      while (order[at] !== undefined) at = (at + 1) % total;
      order[at] = kind;
    }
  };
  spread('unknown', plan.unknown, 0.5);
  spread('permanent', plan.permanent, 0.7);
  spread('exhausted', plan.exhausted, 0.9);
  spread('flaky', plan.flaky, 0.3);
  return Array.from(order, (kind) => kind ?? 'ok');
}

/** Records that a handler started running a job (the demo keeps a table of runs). */
export type RecordRun = (job: Job, ctx: JobContext) => Promise<void>;

function work(signal: AbortSignal, minMs: number, maxMs: number): Promise<void> {
  const ms = minMs + Math.random() * (maxMs - minMs);
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

function transient(attempt: number): Error {
  return attempt % 2 === 1
    ? Object.assign(new Error('warehouse API: connection reset (ECONNRESET)'), { code: 'ECONNRESET' })
    : Object.assign(new Error('warehouse API answered 503 Service Unavailable'), { status: 503 });
}

/**
 * The handlers of the demo's job types (none for `demo.legacy-export`). Each
 * records its run first, then "works" for a few milliseconds, so a crash
 * finds jobs in flight. A job that succeeds makes its effect last, through
 * `ctx.tx` (`effectSql`, with the job id as $1): it commits with the
 * completion, so it happens once however often the job runs.
 */
export function demoHandlers(
  recordRun: RecordRun,
  effectSql: string,
  workMs: { min: number; max: number } = { min: 2, max: 12 },
): Record<string, JobHandler<never>> {
  const begin = async (job: Job, ctx: JobContext) => {
    if (ctx.signal.aborted) throw ctx.signal.reason;
    await recordRun(job, ctx);
    await work(ctx.signal, workMs.min, workMs.max);
  };
  const handlers: Record<string, JobHandler<never>> = {
    [demoJobs.ok.name]: (async (job: Job<{ order: number }>, ctx: JobContext) => {
      await begin(job, ctx);
      await ctx.tx.query(effectSql, [job.id]);
    }) as JobHandler<never>,
    [demoJobs.flaky.name]: (async (job: Job<{ order: number; failures: number }>, ctx: JobContext) => {
      await begin(job, ctx);
      if (job.attempt <= job.data.failures) throw transient(job.attempt);
      await ctx.tx.query(effectSql, [job.id]);
    }) as JobHandler<never>,
    [demoJobs.permanent.name]: (async (job: Job<{ order: number }>, ctx: JobContext) => {
      await begin(job, ctx);
      throw new PermanentError(`card declined for order ${job.data.order} (402): retrying cannot help`);
    }) as JobHandler<never>,
    [demoJobs.exhausted.name]: (async (job: Job<{ order: number }>, ctx: JobContext) => {
      await begin(job, ctx);
      throw Object.assign(new Error(`partner API answered 503 Service Unavailable for order ${job.data.order}`), { status: 503 });
    }) as JobHandler<never>,
  };
  return handlers;
}
