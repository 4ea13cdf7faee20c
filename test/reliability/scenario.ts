/**
 * One scenario of the fault matrix (test/reliability.test.ts): a fresh schema
 * on the private PostgreSQL cluster, mailroom processes (workers, internal
 * consumer group, relay, RabbitMQ consumer group), the producers' workload,
 * the scenario's fault while the workload runs, then recovery, a drain, and
 * the history checker over everything that happened.
 */
import { connect as amqpConnect } from 'amqplib';
import pg from 'pg';
import { createMailroom, type Duration, type Mailroom, type RetryOptions } from '../../src/index.ts';
import { openMailroom } from '../../src/mailroom.ts';
import { PgDriver } from '../../src/storage/pg-driver.ts';
import { within } from '../../src/time-limit.ts';
import { uniqueSchema } from '../helpers/databases.ts';
import { NodeFleet } from './children.ts';
import { INPROC_GROUP, QUICK_STALL_CHECK, relEvent, type NodeProcessConfig, type NodeRole } from './definitions.ts';
import { FaultProxy } from './fault-proxy.ts';
import { historyQueries } from './history-queries.ts';
import { OpLog, checkHistory, readHistory, type CheckReport } from './history.ts';
import type { PgCluster } from './pg-cluster.ts';
import { startWorkload, type RunningWorkload } from './workload.ts';

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Each running scenario's clean-up, for {@link abandonScenarios}. */
const running = new Set<() => Promise<void>>();

/**
 * Cleans up every scenario still running: one whose test timed out is never resumed, and its
 * processes, producers and proxies would keep the test file alive for good. For an `after` hook.
 */
export async function abandonScenarios(): Promise<void> {
  for (const cleanUp of [...running]) await cleanUp();
}

export const randomInt = (min: number, max: number) => min + Math.floor(Math.random() * (max - min + 1));

/** Attempts are generous: a restart or reset fails attempts that are no fault of the job. */
export const RETRY: RetryOptions = { maxAttempts: 60, backoff: { base: 20, max: 400 } };

export interface FaultContext {
  fleet: NodeFleet;
  cluster: PgCluster;
  /** Between mailroom (processes and producers) and PostgreSQL, when the scenario asked for it. */
  pgProxy: FaultProxy | null;
  /** Between mailroom and RabbitMQ, when the scenario asked for it. */
  rabbitProxy: FaultProxy | null;
  workload: RunningWorkload;
  log: OpLog;
  schema: string;
  /** SQL on the cluster, directly (never through the proxy). */
  sql<R = Record<string, unknown>>(text: string, params?: unknown[]): Promise<R[]>;
  /** Resolves when at least `n` operations were invoked. */
  opsInvoked(n: number, timeoutMs?: number): Promise<void>;
  /** The application_name prefix of every mailroom session of the scenario (processes and producers). */
  appPrefix: string;
}

export interface ScenarioOptions {
  name: string;
  /** Processes running the `jobs` and `inproc` roles. */
  workers: number;
  /** Events also go through RabbitMQ to the `rabbit` group (needs RABBITMQ_URL). */
  rabbit: boolean;
  pgProxy?: boolean;
  /** Every mailroom of the scenario checks stalled PostgreSQL connections with QUICK_STALL_CHECK (the fault stalls them). */
  quickStallCheck?: boolean;
  rabbitProxy?: boolean;
  lease?: Duration;
  sleepMs?: [number, number];
  /**
   * The fault, run while the producers produce; the workload stops when it resolves. Returns the
   * faults injected (named counts) and facts the scenario asserts on afterwards.
   */
  fault(ctx: FaultContext): Promise<Record<string, number>>;
}

export interface ScenarioResult {
  report: CheckReport;
  faults: Record<string, number>;
  /** The producers' transactions: committed, failed (before or during their operations), rolled back, unknown. */
  transactions: { committed: number; failed: number; rolledBack: number; unknown: number };
  summary: Record<string, unknown>;
  fleet: NodeFleet;
  /** SQL on the scenario's schema after the run (before it is dropped): for the scenario's own checks. */
  ctx: FaultContext;
}

export interface ScenarioEnv {
  cluster: PgCluster;
  rabbitUrl: string | null;
  soak: boolean;
}

/**
 * Runs one scenario to the end and returns the checker's report (the caller asserts on it); `check`
 * runs after the drain, before the schema is dropped.
 *
 * @example
 * const { report } = await runScenario(env, { name: 'kill', workers: 2, rabbit: true, fault: async (ctx) => ({ kills: 3 }) }, async () => {});
 */
export async function runScenario(env: ScenarioEnv, options: ScenarioOptions, check: (result: ScenarioResult) => Promise<void>): Promise<ScenarioResult> {
  const t0 = Date.now();
  const cleanup: (() => Promise<unknown>)[] = [];
  const cleanUp = async () => {
    running.delete(cleanUp);
    // Each step at most 5 s: one that hangs (a close on a stalled connection) must not hold the rest.
    for (const fn of cleanup.splice(0)) await within(fn().then(() => undefined, () => undefined), 5_000, undefined);
  };
  running.add(cleanUp);
  const schema = uniqueSchema('rel');
  const appPrefix = `rel${process.pid}${options.name.replace(/[^a-z]/g, '').slice(0, 6)}`;
  const admin = new pg.Pool({ connectionString: env.cluster.url('rel-admin'), max: 3 });
  admin.on('error', () => {});
  cleanup.push(() => admin.end());
  const sql = async <R,>(text: string, params: unknown[] = []) => (await admin.query(text, params)).rows as R[];
  try {
    await sql(`CREATE SCHEMA "${schema}"`);
    cleanup.unshift(() => sql(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`));
    const direct = await createMailroom({ database: env.cluster.url('rel-admin'), schema, poolSize: 3 });
    cleanup.unshift(() => direct.close({ timeout: 500 }));
    await direct.migrate();
    await sql(historyQueries(`"${schema}"`).createTables);
    // Subscribe the internal group before anything is published (a new group starts 'now').
    const subscriber = direct.consumer({ group: INPROC_GROUP, retry: RETRY, handlers: { [relEvent.type]: () => {} } });
    await subscriber.start();
    await subscriber.stop();

    let rabbit: NodeProcessConfig['rabbit'] = null;
    let pgProxy: FaultProxy | null = null;
    let rabbitProxy: FaultProxy | null = null;
    let queue = '';
    if (options.rabbit) {
      if (!env.rabbitUrl) throw new Error('this scenario needs RABBITMQ_URL');
      const exchange = `mailroom-rel-${schema}`;
      queue = exchange;
      const connection = await amqpConnect(env.rabbitUrl);
      connection.on('error', () => {});
      const channel = await connection.createChannel();
      await channel.assertExchange(exchange, 'topic', { durable: true });
      await channel.assertQueue(queue, { durable: true, arguments: { 'x-queue-type': 'quorum' } });
      await channel.bindQueue(queue, exchange, '#');
      await connection.close();
      cleanup.unshift(async () => {
        const c = await amqpConnect(env.rabbitUrl!);
        c.on('error', () => {});
        const ch = await c.createChannel();
        await ch.deleteQueue(queue).catch(() => {});
        await ch.deleteExchange(exchange).catch(() => {});
        await c.close().catch(() => {});
      });
      let brokerUrl = env.rabbitUrl;
      if (options.rabbitProxy) {
        const target = new URL(env.rabbitUrl);
        rabbitProxy = await FaultProxy.start({ host: target.hostname, port: Number(target.port || 5672) });
        cleanup.unshift(() => rabbitProxy!.close());
        target.hostname = '127.0.0.1';
        target.port = String(rabbitProxy.port);
        brokerUrl = target.toString();
      }
      rabbit = { url: brokerUrl, exchange, queue };
    }
    let dbUrl = env.cluster.url();
    if (options.pgProxy) {
      pgProxy = await FaultProxy.start({ host: '127.0.0.1', port: env.cluster.port });
      cleanup.unshift(() => pgProxy!.close());
      dbUrl = `postgres://postgres@127.0.0.1:${pgProxy.port}/postgres`;
    }

    const fleet = new NodeFleet({
      url: dbUrl,
      schema,
      appPrefix,
      concurrency: 4,
      lease: options.lease ?? '2s',
      relayLease: '1500ms',
      rescueInterval: '250ms',
      pollInterval: '100ms',
      sleepMs: options.sleepMs ?? [2, 20],
      retry: RETRY,
      rabbit,
      ...(options.quickStallCheck ? { stallCheck: QUICK_STALL_CHECK } : {}),
    });
    cleanup.unshift(() => fleet.killAll());
    for (let i = 0; i < options.workers; i++) fleet.spawn(['jobs', 'inproc']);
    fleet.spawn(options.rabbit ? ['relay', 'rabbit'] : ['relay']);
    await fleet.allReady();

    const producerUrl = new URL(dbUrl);
    producerUrl.searchParams.set('application_name', `${appPrefix}-producer`);
    const producers = options.quickStallCheck
      ? await openMailroom({ schema, poolSize: 6 }, async () => new PgDriver(new pg.Pool({ connectionString: producerUrl.toString(), max: 6 }), true, undefined, QUICK_STALL_CHECK))
      : await createMailroom({ database: producerUrl.toString(), schema, poolSize: 6 });
    producers.on('error', () => {});
    cleanup.unshift(() => producers.close({ timeout: 500 }));
    const log = new OpLog(options.name.replace(/[^a-z]/g, '').slice(0, 8) || 'op');
    const workload = startWorkload({
      mailroom: producers,
      log,
      retry: RETRY,
      producers: 3,
      keysPerProducer: 6,
      rabbit: options.rabbit,
      pauseMs: [15, 50],
      maxOps: 1_000_000,
    });
    cleanup.unshift(() => workload.stop()); // before the producers' close: its loop would go on for good
    const ctx: FaultContext = {
      fleet,
      cluster: env.cluster,
      pgProxy,
      rabbitProxy,
      workload,
      log,
      schema,
      sql,
      appPrefix,
      async opsInvoked(n, timeoutMs = 30_000) {
        const deadline = Date.now() + timeoutMs;
        while (log.ops().length < n) {
          if (Date.now() > deadline) throw new Error(`only ${log.ops().length} of ${n} operations invoked after ${timeoutMs} ms`);
          await sleep(20);
        }
      },
    };

    let faults: Record<string, number>;
    try {
      faults = await options.fault(ctx);
    } finally {
      pgProxy?.heal();
      rabbitProxy?.heal();
      for (const c of fleet.live) if (c.paused) fleet.resume(c);
    }
    /** A phase after the fault that must end within `ms`; otherwise the failure says which, and what the processes last reported. */
    const bounded = async <T,>(phase: string, promise: Promise<T>, ms: number): Promise<T> => {
      const late = Symbol('late');
      const outcome = await within<T | typeof late>(promise, ms, late);
      if (outcome !== late) return outcome;
      const proxies = JSON.stringify({ pg: pgProxy?.stats(), rabbit: rabbitProxy?.stats() });
      throw new Error(`${options.name}: ${phase} did not end within ${ms} ms (proxies ${proxies}; last errors:\n${fleet.lastErrors(12).join('\n')})`);
    };
    await bounded("the producers' stop", workload.stop(), 60_000);
    const faultsDoneMs = Date.now() - t0;

    // Recovery: every role has a live process again, then everything drains. A replacement still
    // booting counts: a second relay + rabbit process would make two consumers of the RabbitMQ
    // queue, which the broker serves round-robin, and per-key order across them is not promised.
    const fleetRoles: NodeRole[][] = [['jobs', 'inproc'], options.rabbit ? ['relay', 'rabbit'] : ['relay']];
    for (const roles of fleetRoles) if (fleet.alive(roles[0]!).length === 0) fleet.spawn(roles);
    await bounded('every role ready again', fleet.allReady(), 60_000);
    const drain = await bounded('the drain', drainRun(direct, sql, schema, log, env.rabbitUrl, queue), 100_000);
    await fleet.killAll();

    const report = checkHistory({ ops: log.ops(), ...(await readHistory(admin, schema)) });
    const lostTrail = report.lost > 0 ? await traceLost(sql, schema, report) : undefined;
    const summary = {
      scenario: options.name,
      messages: log.ops().length,
      transactions: workload.transactions,
      ops: report.ops,
      expectedEffects: report.expected,
      effects: report.effects,
      faults,
      lost: report.lost,
      duplicated: report.duplicated,
      unexpected: report.unexpected,
      rolledBackApplied: report.rolledBack,
      orderViolations: report.orderViolations,
      staleCompletions: report.staleCompletions,
      duplicateDeliveries: report.duplicateDeliveries,
      unknownApplied: report.unknownApplied,
      unknownNotApplied: report.unknownNotApplied,
      processes: fleet.all.length,
      crashedProcesses: fleet.crashed.length,
      drainMs: drain.ms,
      drainComplete: drain.complete,
      ...(lostTrail ? { lostTrail } : {}),
      faultsDoneMs,
      totalMs: Date.now() - t0,
    };
    console.log(`RELIABILITY ${JSON.stringify(summary)}`);
    const result: ScenarioResult = { report, faults, transactions: workload.transactions, summary, fleet, ctx };
    await check(result);
    return result;
  } finally {
    await cleanUp();
  }
}

/**
 * Where the first lost effects stopped, for the failure message: each lost
 * operation's outbox row (a publish), the jobs carrying it with their state and
 * errors, and the relay's cursors.
 */
async function traceLost(sql: <R>(text: string, params?: unknown[]) => Promise<R[]>, schema: string, report: CheckReport): Promise<unknown> {
  const s = `"${schema}"`;
  const lost = report.violations.filter((v) => v.kind === 'lost');
  const cursors = await sql(`SELECT target, cursor_xid::text AS xid, cursor_position::text AS position, holder, delivered::text AS delivered FROM ${s}.relay_cursors`);
  const ops = [];
  for (const v of lost) {
    const outbox = await sql(`SELECT position::text AS position, xid::text AS xid, subject FROM ${s}.outbox WHERE data->>'op' = $1`, [v.op]);
    const jobs = await sql(
      `SELECT j.id, j.queue, j.state, j.attempt, j.max_attempts, j.claim_count, j.blocked, j.ordering_key, j.ordering_seq::text AS ordering_seq, j.dead_reason,
              (SELECT json_agg(json_build_object('claim', e.claim, 'category', e.category, 'message', left(e.message, 200)) ORDER BY e.claim)
                 FROM ${s}.job_errors AS e WHERE e.job_id = j.id) AS errors
         FROM ${s}.jobs AS j WHERE j.payload->'data'->>'op' = $1 OR j.payload->>'op' = $1`,
      [v.op],
    );
    ops.push({ op: v.op, dest: v.dest, outbox, jobs });
  }
  return { cursors, ops };
}

/**
 * Waits until the run is drained: no job waiting or running, every relay target's cursor at the
 * end of the outbox, the RabbitMQ queue empty, and every committed operation's effects present
 * (or, if some never arrive, the rest stable for 5 s: the checker then reports them lost).
 */
async function drainRun(
  mailroom: Mailroom,
  sql: <R>(text: string, params?: unknown[]) => Promise<R[]>,
  schema: string,
  log: OpLog,
  rabbitUrl: string | null,
  queue: string,
): Promise<{ ms: number; complete: boolean }> {
  const t0 = Date.now();
  const expected = new Set<string>();
  for (const op of log.ops()) if (op.outcome === 'ok') for (const d of op.destinations) expected.add(`${op.id}/${d}`);
  let quietSince: number | null = null;
  const connection = queue && rabbitUrl ? await amqpConnect(rabbitUrl) : null;
  connection?.on('error', () => {});
  const channel = connection ? await connection.createChannel() : null;
  try {
    while (Date.now() - t0 < 90_000) {
      const [open] = await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE state IN ('scheduled', 'available', 'active', 'retrying')`);
      const stats = await mailroom.stats();
      const unpublished = Object.values(stats.relay).reduce((n, t) => n + t.unpublished, 0);
      const ready = channel ? (await channel.checkQueue(queue)).messageCount : 0;
      const quiet = open!.n === 0 && unpublished === 0 && ready === 0;
      if (quiet) {
        const seen = await sql<{ k: string }>(`SELECT DISTINCT op || '/' || dest AS k FROM "${schema}".h_effects`);
        const have = new Set(seen.map((r) => r.k));
        if ([...expected].every((k) => have.has(k))) return { ms: Date.now() - t0, complete: true };
        quietSince ??= Date.now();
        if (Date.now() - quietSince > 5_000) return { ms: Date.now() - t0, complete: false };
      } else {
        quietSince = null;
      }
      await sleep(100);
    }
    return { ms: Date.now() - t0, complete: false };
  } finally {
    await connection?.close().catch(() => {});
  }
}
