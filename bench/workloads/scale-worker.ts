/**
 * One mailroom worker process of the scale workload. Started by scale.ts with
 * fork(): it opens mailroom, warms up (see {@link warmUp}), says `ready`,
 * starts its worker on `go`, reports its count of completed jobs every few
 * milliseconds, and on `stop` stops and sends back the time of each completion.
 */
import { createMailroom, defineJob, type Mailroom } from '../../dist/index.js';
import { runJobs } from '../../dist/testing/index.js';
import { PREFETCH } from '../adapters/mailroom.ts';
import { now } from '../stats.ts';

export interface ScaleWorkerConfig {
  url: string;
  concurrency: number;
  /** Upper bound of completions this process may see (sizes its buffer). */
  capacity: number;
  /** Jobs drained on a queue of this process's own before `ready` (0: none). */
  warmUpJobs: number;
  /** This process's number, naming its warm-up queue. */
  index: number;
}

export type ToScaleWorker = { type: 'go' } | { type: 'stop' };
export type FromScaleWorker = { type: 'ready' } | { type: 'count'; n: number } | { type: 'done'; times: Float64Array; n: number };

const noop = defineJob('bench.noop', { queue: 'bench' });

/**
 * Drains `warmUpJobs` no-op jobs on a queue of this process's own with the
 * measured worker's settings (`runJobs` of mailroom/testing: a real worker),
 * through the same mailroom (pool): the pool's connections
 * are opened and have prepared the worker's statements, and V8 has compiled
 * its hot path, before the clock starts. A drain of 10,000 jobs takes well
 * under a second, and without this its first completions (up to 100 ms for the
 * first batch on fresh connections) weighed on the smallest backlog alone;
 * the scale workload compares backlog sizes, not start-ups.
 */
async function warmUp(mailroom: Mailroom, config: ScaleWorkerConfig): Promise<void> {
  if (config.warmUpJobs <= 0) return;
  const warm = defineJob<{ i: number }>('bench.warm', { queue: `warm-${config.index}` });
  for (let i = 0; i < config.warmUpJobs; i += 1000) {
    await mailroom.enqueueMany(warm, Array.from({ length: Math.min(1000, config.warmUpJobs - i) }, (_, k) => ({ i: i + k })));
  }
  const { completed } = await runJobs(mailroom, { queues: [warm.queue], concurrency: config.concurrency, prefetch: PREFETCH, handlers: { [warm.name]: async () => {} } });
  if (completed !== config.warmUpJobs) throw new Error(`warm-up: ${completed} of ${config.warmUpJobs} jobs completed`);
}

async function main(config: ScaleWorkerConfig): Promise<void> {
  const send = (message: FromScaleWorker, then?: () => void) => process.send!(message, undefined, {}, () => then?.());
  const mailroom = await createMailroom({ database: config.url });
  const times = new Float64Array(config.capacity);
  let n = 0;
  const worker = mailroom.worker({ queues: ['bench'], concurrency: config.concurrency, prefetch: PREFETCH, handlers: { [noop.name]: async () => {} } });
  worker.on('completed', () => {
    if (n < times.length) times[n] = now();
    n++;
  });
  worker.on('error', (error) => console.error('[bench scale worker]', error));
  let reporter: NodeJS.Timeout | undefined;
  process.on('message', (message: ToScaleWorker) => {
    if (message.type === 'go') {
      void worker.start();
      reporter = setInterval(() => send({ type: 'count', n }), 10);
    } else if (message.type === 'stop') {
      clearInterval(reporter);
      void (async () => {
        await mailroom.close({ timeout: '5s' });
        // Disconnect only once the message is written: a large one may still be queued.
        send({ type: 'done', times: times.slice(0, Math.min(n, times.length)), n }, () => process.disconnect?.());
      })();
    }
  });
  process.on('disconnect', () => process.exit(0));
  await warmUp(mailroom, config);
  send({ type: 'ready' });
}

const raw = process.env.MAILROOM_BENCH_SCALE_WORKER;
if (!raw || !process.send) {
  console.error('this is a process of `npm run bench`; it is not meant to be started by hand');
  process.exit(2);
}
main(JSON.parse(raw) as ScaleWorkerConfig).catch((error: unknown) => {
  console.error('[bench scale worker] failed:', error);
  process.exit(1);
});
