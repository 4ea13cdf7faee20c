/** mailroom itself, built from this working tree (dist/, what users run), on its own fresh database, default settings. */
import pg from 'pg';
import { createMailroom, defineJob, type Mailroom, type Worker } from '../../dist/index.js';
import { createDatabase, dropDatabase } from '../db.ts';
import type { Adapter, AdapterContext, BenchPayload, OnJob, WorkerSettings } from './types.ts';

/** Jobs claimed ahead of free slots: mailroom's counterpart of graphile-worker's local queue. */
export const PREFETCH = 1000;

const noop = defineJob<BenchPayload>('bench.noop', { queue: 'bench' });

export function mailroomAdapter(ctx: AdapterContext): Adapter {
  const dbName = `${ctx.tag}_mailroom`;
  let url = '';
  let mailroom: Mailroom | undefined;
  let worker: Worker | undefined;
  let counter: pg.Pool | undefined;

  const count = async (sql: string): Promise<number> => {
    const { rows } = await counter!.query<{ n: string }>(sql);
    return Number(rows[0]?.n ?? 0);
  };

  return {
    id: 'mailroom',
    async setup() {
      url = await createDatabase(ctx.serverUrl, dbName);
      mailroom = await createMailroom({ database: url });
      await mailroom.migrate();
      counter = new pg.Pool({ connectionString: url, max: 1 });
      counter.on('error', () => {}); // the database is dropped WITH (FORCE) at teardown
    },
    async enqueueOne(payload) {
      await mailroom!.enqueue(noop, payload);
    },
    async enqueueMany(payloads) {
      await mailroom!.enqueueMany(noop, payloads);
    },
    async startWorkers(settings: WorkerSettings, onJob: OnJob) {
      worker = mailroom!.worker({
        queues: ['bench'],
        concurrency: settings.concurrency,
        prefetch: PREFETCH,
        handlers: { [noop.name]: async (job) => onJob(job.data as BenchPayload) },
      });
      worker.on('error', (error) => console.error('[bench mailroom]', error));
      await worker.start();
    },
    unfinished: () => count(`SELECT count(*) AS n FROM mailroom.jobs WHERE state IN ('scheduled', 'available', 'active', 'retrying')`),
    failed: () => count(`SELECT count(*) AS n FROM mailroom.jobs WHERE state = 'dead' OR attempt > 1`),
    async stopWorkers() {
      await worker?.stop({ timeout: '10s' });
      worker = undefined;
    },
    async teardown() {
      await mailroom?.close({ timeout: '5s' }).catch(() => {});
      await counter?.end().catch(() => {});
      mailroom = undefined;
      counter = undefined;
      await dropDatabase(ctx.serverUrl, dbName);
    },
    describe: (s) => `defaults (pool 20, lease 30s, poll 1s), one worker, concurrency ${s.concurrency}, prefetch ${PREFETCH}`,
  };
}
