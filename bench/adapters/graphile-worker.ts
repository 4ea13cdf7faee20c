/**
 * graphile-worker in the configuration of its performance page: the local queue
 * (jobs fetched in batches) and batched completion, pool = concurrency + 1.
 * Completed jobs are deleted, as graphile-worker always does.
 */
import pg from 'pg';
import { createDatabase, dropDatabase } from '../db.ts';
import { loadPeer } from '../load-peer.ts';
import type { Adapter, AdapterContext, BenchPayload, OnJob, WorkerSettings } from './types.ts';

/** The parts of graphile-worker's API this adapter uses. */
interface GraphileWorkerModule {
  makeWorkerUtils(options: { connectionString: string; logger?: unknown }): Promise<WorkerUtils>;
  run(options: {
    connectionString: string;
    concurrency: number;
    maxPoolSize: number;
    noHandleSignals: boolean;
    pollInterval: number;
    logger: unknown;
    taskList: Record<string, (payload: unknown) => Promise<void> | void>;
    preset: { worker: { localQueue: { size: number }; completeJobBatchDelay: number; failJobBatchDelay: number } };
  }): Promise<{ stop(): Promise<void> }>;
  Logger: new (factory: () => (level: string, message: string) => void) => unknown;
}

interface WorkerUtils {
  migrate(): Promise<void>;
  addJob(identifier: string, payload: unknown): Promise<unknown>;
  addJobs(specs: ReadonlyArray<{ identifier: string; payload: unknown }>): Promise<unknown>;
  release(): Promise<void>;
}

/** Local queue size from graphile-worker's performance page (its benchmark configuration). */
const LOCAL_QUEUE_SIZE = 500;

export function graphileWorkerAdapter(ctx: AdapterContext): Adapter {
  const dbName = `${ctx.tag}_graphile`;
  let url = '';
  let gw: GraphileWorkerModule | undefined;
  let utils: WorkerUtils | undefined;
  let runner: { stop(): Promise<void> } | undefined;
  let counter: pg.Pool | undefined;
  let logger: unknown;

  const count = async (sql: string): Promise<number> => {
    const { rows } = await counter!.query<{ n: string }>(sql);
    return Number(rows[0]?.n ?? 0);
  };

  return {
    id: 'graphile-worker',
    async setup() {
      gw = await loadPeer<GraphileWorkerModule>('graphile-worker');
      logger = new gw.Logger(() => (level, message) => {
        if (level === 'error') console.error('[bench graphile-worker]', message);
      });
      url = await createDatabase(ctx.serverUrl, dbName);
      utils = await gw.makeWorkerUtils({ connectionString: url, logger });
      await utils.migrate();
      counter = new pg.Pool({ connectionString: url, max: 1 });
      counter.on('error', () => {}); // the database is dropped WITH (FORCE) at teardown
    },
    async enqueueOne(payload) {
      await utils!.addJob('noop', payload);
    },
    async enqueueMany(payloads) {
      await utils!.addJobs(payloads.map((payload) => ({ identifier: 'noop', payload })));
    },
    async startWorkers(settings: WorkerSettings, onJob: OnJob) {
      runner = await gw!.run({
        connectionString: url,
        concurrency: settings.concurrency,
        maxPoolSize: settings.concurrency + 1,
        noHandleSignals: true,
        pollInterval: 2000,
        logger,
        taskList: { noop: (payload) => onJob(payload as BenchPayload) },
        preset: { worker: { localQueue: { size: LOCAL_QUEUE_SIZE }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } },
      });
    },
    // Completed jobs are deleted; failed ones stay with attempts > 0 and last_error set.
    unfinished: () => count(`SELECT count(*) AS n FROM graphile_worker._private_jobs WHERE last_error IS NULL`),
    failed: () => count(`SELECT count(*) AS n FROM graphile_worker._private_jobs WHERE last_error IS NOT NULL`),
    async stopWorkers() {
      await runner?.stop();
      runner = undefined;
    },
    async teardown() {
      await runner?.stop().catch(() => {});
      await utils?.release().catch(() => {});
      await counter?.end().catch(() => {});
      runner = undefined;
      utils = undefined;
      counter = undefined;
      await dropDatabase(ctx.serverUrl, dbName);
    },
    describe: (s) =>
      `concurrency ${s.concurrency}, maxPoolSize ${s.concurrency + 1}, localQueue.size ${LOCAL_QUEUE_SIZE}, completeJobBatchDelay 0, failJobBatchDelay 0`,
  };
}
