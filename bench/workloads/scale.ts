/**
 * Workload 4, scale (mailroom only): a drain by 1, 2 or 4 worker processes,
 * a drain by one process of a backlog of 10k, 100k (or 1M) waiting jobs, and
 * the same drain as the 1-process one with every job under one of K ordering
 * keys (per-key ordering must cost little).
 * Each process runs mailroom's defaults with the benchmark's concurrency and the
 * drain's prefetch (bench/adapters/mailroom.ts). The
 * clock starts when the already connected processes are told to start and
 * stops at the last recorded completion ('completed' event: the completion is
 * committed). The steady rate is taken over completions 1,000 to 1,000 + W,
 * W = min(10,000, backlog / 2), while the backlog is still near its size, with
 * both ends moved to the end of their completion batch (stats.ts steadyRate).
 * Each process first drains `warmUpJobs` jobs of its own (scale-worker.ts),
 * so that opening connections and compiling the hot path weigh on no backlog.
 */
import pg from 'pg';
import type { ChildProcess } from 'node:child_process';
import { createMailroom, defineJob } from '../../dist/index.js';
import { createDatabase, dropDatabase } from '../db.ts';
import { forkTs, nextMessage } from '../spawn.ts';
import { now, payloads, steadyRate } from '../stats.ts';
import type { BenchPayload } from '../adapters/types.ts';
import type { FromScaleWorker, ScaleWorkerConfig } from './scale-worker.ts';

export interface ScaleParams {
  serverUrl: string;
  tag: string;
  processes: number;
  jobs: number;
  concurrency: number;
  batch: number;
  timeoutMs: number;
  /** Give each job one of this many ordering keys (round robin); unset: no ordering key. */
  orderingKeys?: number;
  /** Jobs each process drains on a queue of its own before the clock starts (scale-worker.ts's warmUp). */
  warmUpJobs: number;
}

export interface ScaleResult {
  processes: number;
  orderingKeys: number | null;
  jobs: number;
  enqueueSeconds: number;
  seconds: number;
  jobsPerSecond: number;
  /** Rate over completions 1,000 .. 1,000 + window, both ends aligned to the end of their completion batch. */
  steadyJobsPerSecond: number;
  /** Completions the steady rate counted (about min(10,000, jobs / 2)). */
  window: number;
  /** Wall time per job at the steady rate, microseconds. */
  microsPerJob: number;
  /** Jobs/s over each tenth of the completions, in order: how the rate changes as the drain goes on. */
  tenths: number[];
  completedInDatabase: number;
  /** The steady rate of every round, in order, when the run was repeated (backlogs; the median round is reported). */
  rounds?: number[];
}

const noop = defineJob<BenchPayload>('bench.noop', { queue: 'bench' });

export async function scale(params: ScaleParams): Promise<ScaleResult> {
  const dbName = `${params.tag}_mailroom`;
  const url = await createDatabase(params.serverUrl, dbName);
  const children: ChildProcess[] = [];
  try {
    const mailroom = await createMailroom({ database: url });
    await mailroom.migrate();
    const e0 = now();
    const keys = params.orderingKeys;
    const options = keys ? { orderingKey: (d: { i: number }) => `k${d.i % keys}` } : {};
    for (let i = 0; i < params.jobs; i += params.batch) await mailroom.enqueueMany(noop, payloads(i, Math.min(params.batch, params.jobs - i)), options);
    const enqueueSeconds = (now() - e0) / 1000;
    await mailroom.close();

    const counts = new Array<number>(params.processes).fill(0);
    for (let p = 0; p < params.processes; p++) {
      const config: ScaleWorkerConfig = { url, concurrency: params.concurrency, capacity: params.jobs + params.concurrency * 2, warmUpJobs: params.warmUpJobs, index: p };
      const child = forkTs('./workloads/scale-worker.ts', { MAILROOM_BENCH_SCALE_WORKER: JSON.stringify(config) });
      children.push(child);
      child.on('message', (m: FromScaleWorker) => {
        if (m.type === 'count') counts[p] = m.n;
      });
    }
    await Promise.all(children.map((c) => nextMessage(c, (m: FromScaleWorker) => (m.type === 'ready' ? true : undefined))));

    const start = now();
    for (const c of children) c.send({ type: 'go' });
    const deadline = Date.now() + params.timeoutMs;
    while (counts.reduce((a, b) => a + b, 0) < params.jobs) {
      if (Date.now() > deadline) throw new Error(`scale: ${counts.reduce((a, b) => a + b, 0)} of ${params.jobs} jobs completed in ${params.timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, 5));
    }
    const done = children.map((c) => nextMessage(c, (m: FromScaleWorker) => (m.type === 'done' ? m : undefined)));
    for (const c of children) c.send({ type: 'stop' });
    const results = await Promise.all(done);

    const times = Float64Array.from(results.flatMap((r) => Array.from(r.times))).sort();
    const end = times[times.length - 1] ?? now();
    const seconds = (end - start) / 1000;
    const skip = Math.min(1000, Math.floor(params.jobs / 10));
    const window = Math.min(10_000, Math.floor(params.jobs / 2));
    const steady = steadyRate(times, skip, window, { startedAt: start });

    const tenths: number[] = [];
    for (let k = 0; k < 10; k++) {
      const from = Math.floor((k * times.length) / 10);
      const to = Math.floor(((k + 1) * times.length) / 10) - 1;
      const t0 = k === 0 ? start : times[from - 1]!;
      const t1 = times[to]!;
      tenths.push(((to - from + 1) / (t1 - t0)) * 1000);
    }

    const client = new pg.Client({ connectionString: url });
    await client.connect();
    const { rows } = await client.query<{ n: string }>(`SELECT count(*) AS n FROM mailroom.jobs WHERE state = 'completed' AND queue = 'bench'`);
    await client.end();

    return {
      processes: params.processes,
      orderingKeys: params.orderingKeys ?? null,
      jobs: params.jobs,
      enqueueSeconds,
      seconds,
      jobsPerSecond: params.jobs / seconds,
      steadyJobsPerSecond: steady.perSecond,
      window: steady.completions,
      microsPerJob: 1e6 / steady.perSecond,
      tenths,
      completedInDatabase: Number(rows[0]?.n ?? 0),
    };
  } finally {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    await dropDatabase(params.serverUrl, dbName);
  }
}
