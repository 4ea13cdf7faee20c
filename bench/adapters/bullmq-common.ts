/**
 * BullMQ on either of its backends (Redis, or its PostgreSQL backend). Both
 * use the same configuration: one Worker with the benchmark's concurrency and
 * `removeOnComplete`, which BullMQ's production and PostgreSQL guides recommend.
 */
import { loadPeer } from '../load-peer.ts';
import type { Adapter, BenchPayload, OnJob, WorkerSettings } from './types.ts';

type JobCounts = Record<string, number>;

interface BullQueue {
  add(name: string, data: unknown): Promise<unknown>;
  addBulk(jobs: Array<{ name: string; data: unknown }>): Promise<unknown>;
  getJobCounts(...types: string[]): Promise<JobCounts>;
  obliterate(options: { force: boolean }): Promise<void>;
  waitUntilReady?(): Promise<unknown>;
  close(): Promise<void>;
}

interface BullWorker {
  on(event: 'error' | 'failed', listener: (...args: unknown[]) => void): void;
  waitUntilReady(): Promise<unknown>;
  close(force?: boolean): Promise<void>;
}

export interface BullmqModule {
  Queue: new (name: string, opts: Record<string, unknown>, backendFactory?: unknown) => BullQueue;
  Worker: new (
    name: string,
    processor: (job: { data: unknown }) => Promise<void>,
    opts: Record<string, unknown>,
    backendFactory?: unknown,
  ) => BullWorker;
  createPostgresBackend: unknown;
  runMigrations(client: unknown): Promise<unknown>;
}

export function loadBullmq(): Promise<BullmqModule> {
  return loadPeer<BullmqModule>('bullmq');
}

export interface BullmqBackend {
  id: string;
  /** Prepares storage; returns the queue options (connection, prefix) and the backend factory (undefined: Redis). */
  prepare(bull: BullmqModule): Promise<{ options: Record<string, unknown>; factory: unknown }>;
  /** Removes what prepare() made. */
  cleanup(): Promise<void>;
  label: string;
}

const QUEUE = 'bench';
const UNFINISHED = ['waiting', 'active', 'delayed', 'prioritized', 'paused', 'waiting-children'];

export function bullmqAdapter(backend: BullmqBackend): Adapter {
  let bull: BullmqModule | undefined;
  let queue: BullQueue | undefined;
  let worker: BullWorker | undefined;
  let options: Record<string, unknown> = {};
  let factory: unknown;

  const sum = (counts: JobCounts) => Object.values(counts).reduce((a, b) => a + b, 0);

  return {
    id: backend.id,
    async setup() {
      bull = await loadBullmq();
      ({ options, factory } = await backend.prepare(bull));
      queue = new bull.Queue(QUEUE, options, factory);
      await queue.waitUntilReady?.();
    },
    async enqueueOne(payload) {
      await queue!.add('noop', payload);
    },
    async enqueueMany(payloads) {
      await queue!.addBulk(payloads.map((data) => ({ name: 'noop', data })));
    },
    async startWorkers(settings: WorkerSettings, onJob: OnJob) {
      worker = new bull!.Worker(
        QUEUE,
        async (job) => onJob(job.data as BenchPayload),
        { ...options, concurrency: settings.concurrency, removeOnComplete: { count: 0 } },
        factory,
      );
      worker.on('error', (e) => console.error(`[bench ${backend.id}]`, e));
      await worker.waitUntilReady();
    },
    unfinished: async () => sum(await queue!.getJobCounts(...UNFINISHED)),
    failed: async () => sum(await queue!.getJobCounts('failed')),
    async stopWorkers() {
      await worker?.close();
      worker = undefined;
    },
    async teardown() {
      await worker?.close(true).catch(() => {});
      await queue?.obliterate({ force: true }).catch(() => {});
      await queue?.close().catch(() => {});
      worker = undefined;
      queue = undefined;
      await backend.cleanup();
    },
    describe: (s) => `${backend.label}; one Worker, concurrency ${s.concurrency}, removeOnComplete`,
  };
}
