/**
 * The demo's run: migrate a fresh schema, start workers, enqueue the
 * workload, crash workers mid-job as it drains, then count the ledger from
 * the database.
 */
import { quoteSchema } from '../identifiers.ts';
import { createMailroom, type Mailroom } from '../mailroom.ts';
import { describeTarget, type OpenDatabase } from '../cli/database.ts';
import { CRASH_DESCRIPTION, type CrashRecord, type Fleet, type FleetSettings } from './fleet.ts';
import { InProcessFleet } from './fleet-in-process.ts';
import { ProcessFleet } from './fleet-processes.ts';
import { countLedger, expectedOutcomes, type Ledger } from './ledger.ts';
import { errorLogger, type Progress } from './progress.ts';
import { createDemoTables, effectSql, runRecorder, schemaHasJobs } from './tables.ts';
import { demoHandlers, demoJobs, FLAKY_FAILURES, planWorkload, workloadOrder, type DemoKind } from './workload.ts';

/** Settings of one demo run. */
export interface DemoOptions {
  schema: string;
  jobs: number;
  workers: number;
  concurrency: number;
  crashes: number;
  timeoutMs: number;
  /** Drop the schema once the ledger is counted. */
  drop: boolean;
  progress: Progress;
}

const LEASE_MS = 1000;
const POLL_MS = 100;
const RESCUE_MS = 250;
const TICK_MS = 100;
const ENQUEUE_BATCH = 100;

const fmt = (value: number): string => value.toLocaleString('en-US');

/** Thrown when `--schema` names a schema that already has a demo or mailroom in it. */
export class SchemaInUseError extends Error {
  override name = 'SchemaInUseError';
}

/**
 * Runs the demo on an open database and returns its ledger. Workers run in
 * this process on the embedded database (crash: abandon) and as child
 * processes on a server (crash: SIGKILL).
 */
export async function runDemo(db: OpenDatabase, options: DemoOptions): Promise<Ledger> {
  const { schema, progress } = options;
  if (await schemaHasJobs(db.query, schema)) {
    throw new SchemaInUseError(`schema "${schema}" already has mailroom or demo tables; leave --schema out for a fresh demo_<time> schema, or name a new one`);
  }
  const plan = planWorkload(options.jobs);
  const mailroom = await createMailroom({ database: db.handle, schema, rescueInterval: RESCUE_MS, poolSize: 4 });
  let fleet: Fleet | undefined;
  let interrupted = false;
  const onSigint = () => {
    interrupted = true;
  };
  process.once('SIGINT', onSigint);
  try {
    await mailroom.migrate();
    await createDemoTables(db.query, schema);
    const settings: FleetSettings = { schema, workers: options.workers, concurrency: options.concurrency, leaseMs: LEASE_MS, pollMs: POLL_MS, rescueMs: RESCUE_MS };
    fleet =
      db.target.kind === 'embedded'
        ? new InProcessFleet(
            mailroom,
            db.query,
            demoHandlers(runRecorder(db.query, schema), effectSql(schema)),
            settings,
            errorLogger((line) => progress.log(`  worker error: ${line}`)),
          )
        : new ProcessFleet(db.target.url, db.query, settings);
    progress.log(
      `mailroom demo: ${fmt(options.jobs)} jobs on ${describeTarget(db.target)}, schema ${schema}; ` +
        `${options.workers} ${db.target.kind === 'embedded' ? 'in-process workers' : 'worker processes'}, ${options.crashes} crashes planned`,
    );
    await fleet.start();
    const startedAt = Date.now();
    const { crashes, stoppedEarly } = await drive(mailroom, db, fleet, plan, options, startedAt, () => interrupted);
    const durationMs = Date.now() - startedAt;
    await fleet.stop();
    await mailroom.close({ timeout: '5s' });
    const counts = await countLedger(db.query, schema);
    const ledger: Ledger = {
      ok:
        counts.lost === 0 &&
        counts.runAfterCompletion === 0 &&
        counts.effects.duplicated === 0 &&
        counts.effects.missing === 0 &&
        counts.unexpected === 0 &&
        stoppedEarly === undefined,
      database: { kind: db.target.kind, location: describeTarget(db.target) },
      schema,
      settings: { jobs: options.jobs, workers: options.workers, concurrency: options.concurrency, lease: `${LEASE_MS / 1000}s`, crashesPlanned: options.crashes },
      ...counts,
      expected: expectedOutcomes(plan),
      crashes: { kind: fleet.crashKind, description: CRASH_DESCRIPTION[fleet.crashKind], count: crashes.length, workers: crashes },
      durationMs,
    };
    if (stoppedEarly) ledger.stoppedEarly = stoppedEarly;
    if (options.drop) await db.query(`DROP SCHEMA ${quoteSchema(schema)} CASCADE`);
    return ledger;
  } catch (error) {
    fleet?.kill();
    await mailroom.close({ timeout: '1s' }).catch(() => {});
    throw error;
  } finally {
    process.removeListener('SIGINT', onSigint);
  }
}

/** Enqueues the workload while the workers drain it, crashing workers at set points; returns when every job is finished. */
async function drive(
  mailroom: Mailroom,
  db: OpenDatabase,
  fleet: Fleet,
  plan: Record<DemoKind, number>,
  options: DemoOptions,
  startedAt: number,
  interrupted: () => boolean,
): Promise<{ crashes: CrashRecord[]; stoppedEarly?: 'timeout' | 'interrupted' }> {
  const { progress } = options;
  const total = options.jobs;
  // Crash points: evenly spaced through the first 90% of the run, so jobs are still in flight.
  const crashAt = Array.from({ length: options.crashes }, (_, i) => Math.floor((total * 0.9 * (i + 1)) / (options.crashes + 1)));
  const crashes: CrashRecord[] = [];
  const enqueue = { done: 0, finished: false, error: undefined as unknown };
  const enqueuing = enqueueWorkload(mailroom, options.schema, plan, (n) => (enqueue.done = n)).then(
    () => (enqueue.finished = true),
    (error: unknown) => (enqueue.error = error ?? new Error('enqueue failed')),
  );
  const deadline = startedAt + options.timeoutMs;
  const s = quoteSchema(options.schema);
  let stoppedEarly: 'timeout' | 'interrupted' | undefined;
  for (;;) {
    if (enqueue.error) throw enqueue.error;
    const rows = await db.query<{ state: string; n: number }>(`SELECT state, count(*)::int AS n FROM ${s}.jobs GROUP BY state`);
    const by = Object.fromEntries(rows.map((r) => [r.state, r.n])) as Record<string, number | undefined>;
    const completed = by.completed ?? 0;
    const dead = by.dead ?? 0;
    const finished = completed + dead;
    const elapsed = Date.now() - startedAt;
    progress.update(
      `  ${(elapsed / 1000).toFixed(1)}s  ${enqueue.finished ? '' : `enqueued ${fmt(enqueue.done)} · `}finished ${fmt(finished)}/${fmt(total)}: ` +
        `${fmt(completed)} completed, ${fmt(dead)} dead · ${fmt(by.active ?? 0)} running · ${fmt(by.retrying ?? 0)} to retry · ` +
        `crashes ${crashes.length}/${options.crashes}`,
    );
    if (enqueue.finished && finished >= total) break;
    if (interrupted()) {
      stoppedEarly = 'interrupted';
      break;
    }
    if (Date.now() > deadline) {
      stoppedEarly = 'timeout';
      break;
    }
    const next = crashAt[crashes.length];
    if (next !== undefined && finished >= next) {
      const crash = await fleet.crashOne(elapsed);
      if (crash) {
        crashes.push(crash);
        const who = crash.pid === undefined ? `worker ${crash.worker}` : `worker process ${crash.worker} (pid ${crash.pid})`;
        const how = fleet.crashKind === 'abandon' ? 'abandoned (no completion, no release, no heartbeats)' : 'killed with SIGKILL';
        progress.log(`  crash ${crashes.length}: ${who} ${how} with ${fmt(crash.inFlight)} jobs in flight; ${crash.replacement} started in its place`);
      }
    }
    await new Promise((resolve) => setTimeout(resolve, TICK_MS));
  }
  await enqueuing;
  if (enqueue.error) throw enqueue.error;
  const took = `${((Date.now() - startedAt) / 1000).toFixed(1)}s`;
  progress.finish(`  ${stoppedEarly ? `${stoppedEarly === 'timeout' ? 'timed out' : 'interrupted'} after ${took}` : `done in ${took}`}; stopping the workers and counting the ledger`);
  return stoppedEarly ? { crashes, stoppedEarly } : { crashes };
}

/** Enqueues the workload in transactions of {@link ENQUEUE_BATCH} jobs, each with its demo_jobs rows. */
async function enqueueWorkload(
  mailroom: Mailroom,
  schema: string,
  plan: Record<DemoKind, number>,
  onProgress: (enqueued: number) => void,
): Promise<void> {
  const order = workloadOrder(plan);
  const record = `INSERT INTO ${quoteSchema(schema)}.demo_jobs (job_id, kind) SELECT * FROM unnest($1::uuid[], $2::text[])`;
  for (let start = 0; start < order.length; start += ENQUEUE_BATCH) {
    const batch = order.slice(start, start + ENQUEUE_BATCH);
    await mailroom.transaction(async (tx) => {
      for (const kind of Object.keys(plan) as DemoKind[]) {
        const orders = batch.flatMap((k, i) => (k === kind ? [start + i + 1] : []));
        if (orders.length === 0) continue;
        const ids =
          kind === 'flaky'
            ? await mailroom.enqueueMany(demoJobs.flaky, orders.map((order) => ({ order, failures: FLAKY_FAILURES })), { tx })
            : await mailroom.enqueueMany(demoJobs[kind], orders.map((order) => ({ order })), { tx });
        await tx.query(record, [ids, ids.map(() => kind)]);
      }
    });
    onProgress(Math.min(order.length, start + ENQUEUE_BATCH));
  }
}
