/**
 * Workload 3, latency: workers idle, then jobs enqueued one at a time at a
 * fixed rate (open loop: the schedule does not wait for the jobs). Latency is
 * from just before the enqueue call to the start of the job's handler, both on
 * this process's clock.
 */
import type { Adapter } from '../adapters/types.ts';
import { mean, now, percentile, sleep, waitUntil } from '../stats.ts';

export interface LatencyParams {
  /** Jobs per second. */
  rate: number;
  /** Jobs measured. */
  jobs: number;
  concurrency: number;
  /** Idle time before the first job, so that workers are really idle (waiting, not polling a backlog). */
  idleMs: number;
}

export interface LatencyResult {
  jobs: number;
  rate: number;
  p50Ms: number;
  p90Ms: number;
  p99Ms: number;
  maxMs: number;
  meanMs: number;
  /** Jobs whose handler had not started when the run ended. */
  missing: number;
}

const WARMUP = 20;

export async function latency(adapter: Adapter, params: LatencyParams): Promise<LatencyResult> {
  const total = WARMUP + params.jobs;
  const latencies = new Float64Array(total).fill(Number.NaN);
  let received = 0;
  await adapter.startWorkers({ concurrency: params.concurrency }, ({ i, t }) => {
    const at = now();
    if (Number.isNaN(latencies[i]!)) {
      received++;
      latencies[i] = at - t;
    }
  });
  await sleep(params.idleMs);

  const interval = 1000 / params.rate;
  const start = now();
  for (let i = 0; i < total; i++) {
    const due = start + i * interval;
    const wait = due - now();
    if (wait > 0) await sleep(wait);
    await adapter.enqueueOne({ i, t: now() });
  }
  await waitUntil(() => received >= total, 10_000, 5);
  await adapter.stopWorkers();

  const measured = Array.from(latencies.subarray(WARMUP)).filter((v) => !Number.isNaN(v));
  return {
    jobs: params.jobs,
    rate: params.rate,
    p50Ms: percentile(measured, 50),
    p90Ms: percentile(measured, 90),
    p99Ms: percentile(measured, 99),
    maxMs: percentile(measured, 100),
    meanMs: mean(measured),
    missing: params.jobs - measured.length,
  };
}
