/**
 * Workload 1, drain: N no-op jobs enqueued in bulk first, then drained by
 * workers with the given total concurrency. The clock starts at the first
 * handler call (so worker start-up is not counted) and stops when every
 * handler has run and the system reports no unfinished job (so completions
 * still being written count).
 */
import type { Adapter } from '../adapters/types.ts';
import { now, payloads, waitUntil } from '../stats.ts';

export interface DrainParams {
  jobs: number;
  concurrency: number;
  /** Jobs per bulk enqueue call while filling the queue. */
  batch: number;
  /** Give up after this long. */
  timeoutMs: number;
}

export interface DrainResult {
  jobs: number;
  seconds: number;
  jobsPerSecond: number;
  /** Handler calls for a job already handled (at-least-once redeliveries during the run). */
  duplicates: number;
  failed: number;
  /** Time from startWorkers() to the first handler call. */
  startupMs: number;
}

export async function drain(adapter: Adapter, params: DrainParams): Promise<DrainResult> {
  for (let i = 0; i < params.jobs; i += params.batch) await adapter.enqueueMany(payloads(i, Math.min(params.batch, params.jobs - i)));

  const seen = new Uint8Array(params.jobs);
  let handled = 0;
  let duplicates = 0;
  let first = 0;
  let allRan: () => void = () => {};
  const ran = new Promise<void>((resolve) => (allRan = resolve));
  const onJob = ({ i }: { i: number }) => {
    if (first === 0) first = now();
    if (seen[i]) duplicates++;
    else {
      seen[i] = 1;
      if (++handled === params.jobs) allRan();
    }
  };

  const started = now();
  await adapter.startWorkers({ concurrency: params.concurrency }, onJob);
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), params.timeoutMs)));
  const outcome = await Promise.race([ran, timedOut]);
  clearTimeout(timer);
  if (outcome === 'timeout') throw new Error(`${adapter.id}: drain timed out: ${handled} of ${params.jobs} jobs ran in ${params.timeoutMs} ms`);
  let unfinished = -1;
  const allRecorded = await waitUntil(async () => (unfinished = await adapter.unfinished()) === 0, params.timeoutMs, 2);
  const end = now();
  if (!allRecorded) throw new Error(`${adapter.id}: ${unfinished} jobs still unfinished after every handler ran`);
  await adapter.stopWorkers();
  const seconds = (end - first) / 1000;
  return {
    jobs: params.jobs,
    seconds,
    jobsPerSecond: params.jobs / seconds,
    duplicates,
    failed: await adapter.failed(),
    startupMs: first - started,
  };
}
