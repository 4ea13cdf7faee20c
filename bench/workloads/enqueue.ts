/**
 * Workload 2, enqueue: jobs/s of single inserts (one call per job, each
 * awaited before the next: what a request handler does) and of batch inserts
 * (the system's bulk API). No worker runs meanwhile.
 */
import type { Adapter } from '../adapters/types.ts';
import { now, payloads } from '../stats.ts';

export interface EnqueueParams {
  /** Jobs enqueued one at a time. */
  single: number;
  /** Jobs enqueued in bulk, `batch` per call. */
  bulk: number;
  batch: number;
}

export interface EnqueueResult {
  single: { jobs: number; seconds: number; jobsPerSecond: number; meanMs: number };
  bulk: { jobs: number; batch: number; seconds: number; jobsPerSecond: number };
}

const WARMUP = 50;

export async function enqueue(adapter: Adapter, params: EnqueueParams): Promise<EnqueueResult> {
  // Warm up connections and prepared statements first; these jobs are not timed.
  for (const p of payloads(0, WARMUP)) await adapter.enqueueOne(p);
  await adapter.enqueueMany(payloads(WARMUP, Math.min(params.batch, 100)));
  let next = WARMUP + 100;

  const t0 = now();
  for (let k = 0; k < params.single; k++) await adapter.enqueueOne({ i: next++, t: now() });
  const singleSeconds = (now() - t0) / 1000;

  const t1 = now();
  for (let k = 0; k < params.bulk; k += params.batch) {
    const n = Math.min(params.batch, params.bulk - k);
    await adapter.enqueueMany(payloads(next, n));
    next += n;
  }
  const bulkSeconds = (now() - t1) / 1000;

  return {
    single: { jobs: params.single, seconds: singleSeconds, jobsPerSecond: params.single / singleSeconds, meanMs: (singleSeconds * 1000) / params.single },
    bulk: { jobs: params.bulk, batch: params.batch, seconds: bulkSeconds, jobsPerSecond: params.bulk / bulkSeconds },
  };
}
