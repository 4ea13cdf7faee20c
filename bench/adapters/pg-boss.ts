/**
 * pg-boss with LISTEN/NOTIFY on (instance `useListenNotify`, queue `notify`),
 * batch fetching (`batchSize`) with several polling workers (`localConcurrency`)
 * so that batchSize x localConcurrency = the benchmark's concurrency, and
 * `burstWhenBatchFull` so a worker fetches again at once while batches come back full.
 */
import pg from 'pg';
import { createDatabase, dropDatabase } from '../db.ts';
import { loadPeer } from '../load-peer.ts';
import type { Adapter, AdapterContext, BenchPayload, OnJob, WorkerSettings } from './types.ts';

interface PgBossInstance {
  on(event: 'error' | 'warning', listener: (e: unknown) => void): void;
  start(): Promise<unknown>;
  stop(options?: { graceful?: boolean; timeout?: number; close?: boolean }): Promise<void>;
  createQueue(name: string, options?: { notify?: boolean }): Promise<void>;
  send(name: string, data: object): Promise<string | null>;
  insert(name: string, jobs: Array<{ data: object }>): Promise<unknown>;
  work(
    name: string,
    options: { batchSize: number; localConcurrency: number; pollingIntervalSeconds: number; burstWhenBatchFull: boolean },
    handler: (jobs: Array<{ data: unknown }>) => Promise<void>,
  ): Promise<string>;
  offWork(name: string, options?: { wait?: boolean }): Promise<void>;
}

interface PgBossModule {
  PgBoss: new (options: { connectionString: string; useListenNotify: boolean; schedule: boolean }) => PgBossInstance;
}

const QUEUE = 'bench';

/** How pg-boss spends the benchmark's concurrency: polling workers x jobs per fetch. */
export function pgBossSplit(concurrency: number): { localConcurrency: number; batchSize: number } {
  const localConcurrency = concurrency >= 4 ? 2 : 1;
  return { localConcurrency, batchSize: Math.max(1, Math.floor(concurrency / localConcurrency)) };
}

export function pgBossAdapter(ctx: AdapterContext): Adapter {
  const dbName = `${ctx.tag}_pgboss`;
  let boss: PgBossInstance | undefined;
  let counter: pg.Pool | undefined;
  let working = false;

  const count = async (sql: string): Promise<number> => {
    const { rows } = await counter!.query<{ n: string }>(sql, [QUEUE]);
    return Number(rows[0]?.n ?? 0);
  };

  return {
    id: 'pg-boss',
    async setup() {
      const { PgBoss } = await loadPeer<PgBossModule>('pg-boss');
      const url = await createDatabase(ctx.serverUrl, dbName);
      // schedule: false only turns off the cron scheduler, which the benchmark does not use.
      boss = new PgBoss({ connectionString: url, useListenNotify: true, schedule: false });
      boss.on('error', (e) => console.error('[bench pg-boss]', e));
      await boss.start();
      await boss.createQueue(QUEUE, { notify: true });
      counter = new pg.Pool({ connectionString: url, max: 1 });
      counter.on('error', () => {}); // the database is dropped WITH (FORCE) at teardown
    },
    async enqueueOne(payload) {
      await boss!.send(QUEUE, payload);
    },
    async enqueueMany(payloads) {
      await boss!.insert(
        QUEUE,
        payloads.map((data) => ({ data })),
      );
    },
    async startWorkers(settings: WorkerSettings, onJob: OnJob) {
      const split = pgBossSplit(settings.concurrency);
      await boss!.work(QUEUE, { ...split, pollingIntervalSeconds: 0.5, burstWhenBatchFull: true }, async (jobs) => {
        for (const job of jobs) onJob(job.data as BenchPayload);
      });
      working = true;
    },
    unfinished: () => count(`SELECT count(*) AS n FROM pgboss.job WHERE name = $1 AND state IN ('created', 'retry', 'active')`),
    failed: () => count(`SELECT count(*) AS n FROM pgboss.job WHERE name = $1 AND (state = 'failed' OR retry_count > 0)`),
    async stopWorkers() {
      if (working) await boss?.offWork(QUEUE, { wait: true });
      working = false;
    },
    async teardown() {
      await boss?.stop({ graceful: true, timeout: 5000, close: true }).catch(() => {});
      await counter?.end().catch(() => {});
      boss = undefined;
      counter = undefined;
      await dropDatabase(ctx.serverUrl, dbName);
    },
    describe: (s) => {
      const { localConcurrency, batchSize } = pgBossSplit(s.concurrency);
      return `localConcurrency ${localConcurrency} x batchSize ${batchSize}, burstWhenBatchFull, pollingIntervalSeconds 0.5, useListenNotify + queue notify`;
    },
  };
}
