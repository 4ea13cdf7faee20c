/**
 * `mailroom bench`: how fast mailroom runs on *your* database: a drain of no-op
 * jobs enqueued in bulk, and enqueue-to-start latency at a fixed rate, in a
 * scratch schema that is dropped afterwards. The comparison with the peer
 * queues (graphile-worker, pg-boss, BullMQ) is `npm run bench` in the repository.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defineJob } from '../define.ts';
import { createMailroom, type Mailroom } from '../mailroom.ts';
import type { Job } from '../worker/types.ts';
import { integerOption, stringOption, type CommandSpec } from './args.ts';
import { describeTarget, openDatabase, resolveTarget, type DatabaseTarget } from './database.ts';
import { startProgress, type ProgressStream } from './progress.ts';

/** What one `mailroom bench` run measured. */
export interface BenchResult {
  database: string;
  drain: { jobs: number; concurrency: number; seconds: number; jobsPerSecond: number };
  enqueue: { jobs: number; batchSize: number; jobsPerSecond: number };
  latency: { jobs: number; ratePerSecond: number; p50Ms: number; p99Ms: number; maxMs: number };
}

const noop = defineJob<{ n: number }>('mailroom.bench.noop', { queue: 'mailroom-bench' });
const timed = defineJob<{ at: number }>('mailroom.bench.latency', { queue: 'mailroom-bench-latency' });

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

const round = (n: number, digits = 1) => Math.round(n * 10 ** digits) / 10 ** digits;

async function drain(mailroom: Mailroom, jobs: number, concurrency: number, batchSize: number, err: ProgressStream | undefined): Promise<Pick<BenchResult, 'drain' | 'enqueue'>> {
  const enqueued = err && startProgress(err, 'enqueue', jobs);
  const enqueueStart = performance.now();
  for (let i = 0; i < jobs; i += batchSize) {
    await mailroom.enqueueMany(noop, Array.from({ length: Math.min(batchSize, jobs - i) }, (_, k) => ({ n: i + k })));
    enqueued?.update(Math.min(jobs, i + batchSize));
  }
  const enqueueSeconds = (performance.now() - enqueueStart) / 1000;
  enqueued?.finish();
  let done = 0;
  let finish!: () => void;
  const all = new Promise<void>((resolve) => (finish = resolve));
  const drained = err && startProgress(err, 'drain', jobs);
  const worker = mailroom.worker({ queues: [noop.queue], concurrency, prefetch: Math.max(concurrency, 500), handlers: { [noop.name]: () => undefined } });
  worker.on('completed', () => {
    done++; // not inside drained?.update(…): without progress the whole call, argument included, is skipped
    drained?.update(done);
    if (done === jobs) finish();
  });
  const start = performance.now();
  await worker.start();
  await all;
  const seconds = (performance.now() - start) / 1000;
  drained?.finish();
  await worker.stop();
  return {
    drain: { jobs, concurrency, seconds: round(seconds, 3), jobsPerSecond: Math.round(jobs / seconds) },
    enqueue: { jobs, batchSize, jobsPerSecond: Math.round(jobs / enqueueSeconds) },
  };
}

async function latency(mailroom: Mailroom, jobs: number, ratePerSecond: number): Promise<BenchResult['latency']> {
  const waits: number[] = [];
  let finish!: () => void;
  const all = new Promise<void>((resolve) => (finish = resolve));
  const worker = mailroom.worker({
    queues: [timed.queue],
    concurrency: 10,
    pollInterval: 1000,
    handlers: {
      [timed.name]: (job: Job<{ at: number }>) => {
        waits.push(performance.timeOrigin + performance.now() - job.data.at);
        if (waits.length === jobs) finish();
      },
    },
  });
  await worker.start();
  const gapMs = 1000 / ratePerSecond;
  const begin = performance.now();
  for (let i = 0; i < jobs; i++) {
    const due = begin + i * gapMs;
    const wait = due - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    await mailroom.enqueue(timed, { at: performance.timeOrigin + performance.now() });
  }
  await all;
  await worker.stop();
  const sorted = waits.sort((a, b) => a - b);
  return { jobs, ratePerSecond, p50Ms: round(percentile(sorted, 50), 2), p99Ms: round(percentile(sorted, 99), 2), maxMs: round(sorted.at(-1) ?? 0, 2) };
}

function scratchTarget(target: DatabaseTarget, explicitDir: boolean): { target: DatabaseTarget; cleanup(): void } {
  if (target.kind === 'postgres' || explicitDir) return { target, cleanup: () => {} };
  // The embedded database: a directory of its own, so the bench never touches ./.mailroom.
  const dir = mkdtempSync(join(tmpdir(), 'mailroom-bench-'));
  return { target: { kind: 'embedded', dir }, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** The `bench` command. */
export const benchCommand: CommandSpec = {
  name: 'bench',
  summary: 'measure drain throughput and enqueue-to-start latency on your database (scratch schema, dropped after)',
  usage: 'mailroom bench [--database URL | --data-dir DIR] [--jobs N] [--concurrency N] [--latency-jobs N] [--rate N] [--json]',
  options: {
    database: { type: 'string', value: 'URL', description: 'PostgreSQL URL; default $DATABASE_URL, else an embedded database in a temporary directory' },
    'data-dir': { type: 'string', value: 'DIR', description: 'directory of an embedded PGlite database to use instead' },
    jobs: { type: 'string', value: 'N', description: 'jobs in the drain (default 20000)' },
    concurrency: { type: 'string', value: 'N', description: 'worker concurrency in the drain (default 20)' },
    'batch-size': { type: 'string', value: 'N', description: 'jobs per enqueueMany call before the drain (default 1000)' },
    'latency-jobs': { type: 'string', value: 'N', description: 'jobs enqueued one at a time for the latency figures (default 500; 0 skips)' },
    rate: { type: 'string', value: 'N', description: 'jobs per second in the latency run (default 200)' },
  },
  details:
    'Runs in a schema of its own (mailroom_bench_<pid>) that is dropped at the end, so it is safe on a\n' +
    'shared database; it loads the server while it runs. The comparison with graphile-worker, pg-boss\n' +
    'and BullMQ on the same server is `npm run bench` in the mailroom repository (docs/BENCHMARKS.md).',
  async run(values, io) {
    const jobs = integerOption(values.jobs, 'jobs', 20_000, 1, 10_000_000);
    const concurrency = integerOption(values.concurrency, 'concurrency', 20, 1, 1000);
    const batchSize = integerOption(values['batch-size'], 'batch-size', 1000, 1, 10_000);
    const latencyJobs = integerOption(values['latency-jobs'], 'latency-jobs', 500, 0, 1_000_000);
    const rate = integerOption(values.rate, 'rate', 200, 1, 100_000);
    const dataDir = stringOption(values['data-dir']);
    const { target, cleanup } = scratchTarget(resolveTarget(stringOption(values.database), dataDir, true), dataDir !== undefined);
    const schema = `mailroom_bench_${process.pid}`;
    const db = await openDatabase(target, concurrency + 5);
    try {
      const mailroom = await createMailroom({ database: db.handle, schema });
      try {
        await mailroom.migrate();
        if (!values.json) io.err.write(`mailroom bench on ${describeTarget(target)}: draining ${jobs} jobs at concurrency ${concurrency}...\n`);
        // Progress on stderr (a bar on a terminal, lines elsewhere), as for migrate and dlq; none with --json.
        const drained = await drain(mailroom, jobs, concurrency, batchSize, values.json ? undefined : io.err);
        if (!values.json && latencyJobs > 0) io.err.write(`latency: ${latencyJobs} jobs at ${rate}/s...\n`);
        const lat = latencyJobs > 0 ? await latency(mailroom, latencyJobs, rate) : { jobs: 0, ratePerSecond: rate, p50Ms: 0, p99Ms: 0, maxMs: 0 };
        const result: BenchResult = { database: describeTarget(target), ...drained, latency: lat };
        io.out.write(values.json ? `${JSON.stringify(result)}\n` : report(result));
      } finally {
        await mailroom.close();
      }
    } finally {
      await db.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => {});
      await db.close();
      cleanup();
    }
    return 0;
  },
};

function report(r: BenchResult): string {
  const lines = [
    `drain:   ${r.drain.jobsPerSecond.toLocaleString('en-US')} jobs/s (${r.drain.jobs} jobs, concurrency ${r.drain.concurrency}, ${r.drain.seconds} s)`,
    `enqueue: ${r.enqueue.jobsPerSecond.toLocaleString('en-US')} jobs/s (enqueueMany, ${r.enqueue.batchSize} per call)`,
  ];
  if (r.latency.jobs > 0) {
    lines.push(`latency: p50 ${r.latency.p50Ms} ms, p99 ${r.latency.p99Ms} ms, max ${r.latency.maxMs} ms (enqueue to handler start, ${r.latency.jobs} jobs at ${r.latency.ratePerSecond}/s)`);
  }
  return `${lines.join('\n')}\n`;
}
