/**
 * Entry of one demo worker process (PostgreSQL server only). The demo spawns
 * it with its settings in MAILROOM_DEMO_WORKER, waits for `ready`, may SIGKILL
 * it, and at the end sends `stop` for a graceful shutdown.
 */
import pg from 'pg';
import { createMailroom } from '../mailroom.ts';
import { errorLogger } from './progress.ts';
import { effectSql, runRecorder } from './tables.ts';
import { DEMO_QUEUE, demoHandlers } from './workload.ts';

/** What the demo passes to a worker process (as JSON in MAILROOM_DEMO_WORKER). */
export interface WorkerProcessConfig {
  url: string;
  schema: string;
  id: string;
  concurrency: number;
  leaseMs: number;
  pollMs: number;
  rescueMs: number;
}

/** Messages between the demo and a worker process. */
export type ToWorker = { type: 'stop' };
export type FromWorker = { type: 'ready' };

async function runWorkerProcess(config: WorkerProcessConfig): Promise<void> {
  // A few connections serve claims, heartbeats, completions and the handlers' run records and ctx.tx
  // (a short wait for one is harmless); several processes must fit within the server's max_connections.
  const pool = new pg.Pool({ connectionString: config.url, max: Math.max(4, Math.min(config.concurrency + 2, 8)) });
  pool.on('error', () => {});
  const query = async <R,>(sql: string, params?: unknown[]) => (await pool.query(sql, params)).rows as R[];
  const mailroom = await createMailroom({ database: pool, schema: config.schema, rescueInterval: config.rescueMs });
  const worker = mailroom.worker({
    id: config.id,
    queues: [DEMO_QUEUE],
    concurrency: config.concurrency,
    lease: config.leaseMs,
    pollInterval: config.pollMs,
    handlers: demoHandlers(runRecorder(query, config.schema), effectSql(config.schema)),
  });
  worker.on('error', errorLogger((line) => console.error(`[demo worker ${config.id}] ${line}`)));
  await worker.start();
  process.on('message', (message: ToWorker) => {
    if (message?.type !== 'stop') return;
    void (async () => {
      try {
        await mailroom.close({ timeout: '5s' });
        await pool.end();
      } catch (error) {
        console.error(`[demo worker ${config.id}] could not stop cleanly:`, error instanceof Error ? error.message : error);
        process.exitCode = 1;
      } finally {
        process.disconnect?.();
      }
    })();
  });
  // The demo went away (crashed or killed): do not linger. Ctrl-C reaches the whole process group;
  // the demo answers it by stopping its workers gracefully, so this process waits for that.
  process.on('disconnect', () => process.exit());
  process.on('SIGINT', () => {});
  process.send?.({ type: 'ready' } satisfies FromWorker);
}

const raw = process.env.MAILROOM_DEMO_WORKER;
if (!raw || !process.send) {
  console.error('this is the demo worker process; run `mailroom demo --database postgres://...` instead of starting it directly');
  process.exit(2);
}
runWorkerProcess(JSON.parse(raw) as WorkerProcessConfig).catch((error: unknown) => {
  console.error('[demo worker] failed to start:', error instanceof Error ? error.message : error);
  process.exit(1);
});
