/**
 * `npm run bench`: runs each workload for each system in a fresh child process,
 * in workload order (so that the systems of one comparison run close together
 * in time), then prints the report (and JSON with --json).
 */
import type { ChildProcess } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import os from 'node:os';
import { makeAdapter, type SystemId } from './adapters/index.ts';
import { summarizeDrain, summarizeEnqueue, summarizeScale } from './rounds.ts';
import type { AdapterContext } from './adapters/types.ts';
import type { Task, TaskAnswer, TaskResult } from './child.ts';
import type { DrainResult } from './workloads/drain.ts';
import type { EnqueueResult } from './workloads/enqueue.ts';
import type { LatencyResult } from './workloads/latency.ts';
import type { ScaleResult } from './workloads/scale.ts';
import type { CeilingResult } from './workloads/ceiling.ts';
import { HELP, parseArgs, type BenchConfig } from './config.ts';
import { dropLeftovers, enableAutovacuum } from './db.ts';
import { machineInfo } from './machine.ts';
import { report } from './report.ts';
import type { Outcome, Results } from './results.ts';
import { forkTs, nextMessage } from './spawn.ts';
import { now } from './stats.ts';

const runId = `mrbench_${Date.now().toString(36)}`;
const children = new Set<ChildProcess>();
/** Puts the server's autovacuum setting back (`--autovacuum`). */
let restoreAutovacuum: (() => Promise<void>) | undefined;

function log(line: string): void {
  process.stderr.write(`${line}\n`);
}

/** How long a child may take to clean up (drop its database) after answering, before it is killed. */
const EXIT_GRACE_MS = 30_000;

async function runTask<T extends TaskResult>(task: Task, timeoutMs: number): Promise<Outcome<T>> {
  const child = forkTs('./child.ts', {});
  children.add(child);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  let timer: NodeJS.Timeout | undefined;
  try {
    const answer = nextMessage(child, (m: TaskAnswer) => m);
    const late = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`no answer in ${timeoutMs} ms`)), timeoutMs)));
    child.send(task);
    const a = await Promise.race([answer, late]);
    return a.ok ? { ok: true, value: a.result as T } : { ok: false, error: a.error };
  } catch (error) {
    return { ok: false, error: error instanceof Error ? error.message : String(error) };
  } finally {
    clearTimeout(timer);
    const grace = setTimeout(() => child.kill('SIGKILL'), EXIT_GRACE_MS);
    await exited;
    clearTimeout(grace);
    children.delete(child);
  }
}

function withoutPassword(url: string): string {
  const u = new URL(url);
  if (u.password) u.password = '***';
  return u.toString();
}

function ctxFor(config: BenchConfig, workload: string): AdapterContext {
  return { serverUrl: config.serverUrl, redisUrl: config.redisUrl, tag: `${runId}_${workload}` };
}

let lastShown = now();

function show<T>(label: string, o: Outcome<T>, summary: (v: T) => string): void {
  const took = ((now() - lastShown) / 1000).toFixed(1);
  lastShown = now();
  log(`  ${label.padEnd(34)} ${o.ok ? summary(o.value) : `FAILED: ${o.error.split('\n').slice(0, 3).join(' / ')}`} [${took} s]`);
}

async function main(): Promise<void> {
  const parsed = parseArgs(process.argv.slice(2));
  if (parsed === 'help') {
    process.stdout.write(HELP);
    return;
  }
  const config = parsed;
  const started = now();
  if (config.autovacuum) {
    restoreAutovacuum = await enableAutovacuum(config.serverUrl);
    if (restoreAutovacuum) log('autovacuum turned on for this run (ALTER SYSTEM); it is reset at the end');
  }
  const machine = await machineInfo(config.serverUrl, config.redisUrl);
  const { json: _json, out: _out, ...shown } = config;
  shown.serverUrl = withoutPassword(shown.serverUrl);
  shown.redisUrl = withoutPassword(shown.redisUrl);
  const results: Results = {
    startedAt: new Date().toISOString(),
    seconds: 0,
    config: shown,
    machine,
    configurations: {},
    drain: {},
    enqueue: {},
    latency: {},
    scale: { processes: [], ordered: undefined, backlogs: [] },
    ceiling: undefined,
    notes: [
      "BullMQ's PostgreSQL backend is BullMQ 6's own createPostgresBackend (package bullmq), not a separate package.",
      'BullMQ on Redis is not measured against the PostgreSQL ceiling: it does not write to PostgreSQL.',
    ],
  };
  if (!('error' in machine.redis) && machine.redis.appendonly === 'no') {
    results.notes.push(`Redis runs with appendonly=${machine.redis.appendonly} and save=${machine.redis.save}: BullMQ-on-Redis figures are for jobs that a Redis restart would lose.`);
  }
  for (const s of config.systems) results.configurations[s] = makeAdapter(s, ctxFor(config, 'x')).describe({ concurrency: config.concurrency });
  log(`mailroom benchmark (${config.mode}${config.big ? ', big' : ''}): ${config.systems.join(', ')}; ${config.workloads.join(', ')}; run ${runId}`);
  log(`load average ${machine.loadAtStart.join(' ')} on ${machine.cpus} CPUs`);
  const taskTimeout = config.timeoutMs + 60_000;

  if (config.workloads.includes('ceiling')) {
    log('ceiling (PostgreSQL itself)');
    results.ceiling = await runTask<CeilingResult>({
      kind: 'ceiling',
      params: {
        serverUrl: config.serverUrl,
        tag: `${runId}_ceiling`,
        seconds: config.ceilingSeconds,
        concurrency: config.concurrency,
        insertBatch: config.batch,
        claimBatch: config.claimBatch,
        loops: config.claimLoops,
        rows: Math.max(config.jobs, 20_000),
      },
    }, config.timeoutMs);
    show('pgbench and claim loops', results.ceiling, (v) =>
      `INSERT ${Math.round(v.insertCommitsPerSecond1)}/s (1 client), ${Math.round(v.insertCommitsPerSecondN)}/s (${v.clientsN}); batched ${Math.round(v.batchInsertRowsPerSecond)} rows/s; claim+delete ${Math.round(v.claimDeleteRowsPerSecond)} rows/s; claim+keep ${Math.round(v.claimKeepRowsPerSecond)} rows/s`,
    );
  }

  const drainParams = { jobs: config.jobs, concurrency: config.concurrency, batch: config.batch, timeoutMs: config.timeoutMs };
  const enqueueParams = { single: config.single, bulk: config.bulk, batch: config.batch };
  for (const workload of ['drain', 'enqueue'] as const) {
    if (!config.workloads.includes(workload)) continue;
    const runs = new Map<SystemId, Array<Outcome<DrainResult>> | Array<Outcome<EnqueueResult>>>();
    for (let round = 1; round <= config.rounds; round++) {
      log(`${workload}${config.rounds > 1 ? `, round ${round} of ${config.rounds}` : ''}`);
      for (const system of config.systems) {
        const ctx = ctxFor(config, `${workload}${round}`);
        if (workload === 'drain') {
          const o = await runTask<DrainResult>({ kind: 'drain', system, ctx, params: drainParams }, taskTimeout);
          show(system, o, (v) => `${Math.round(v.jobsPerSecond)} jobs/s (${v.seconds.toFixed(2)} s; ${v.duplicates} duplicates, ${v.failed} failed)`);
          const list = (runs.get(system) ?? []) as Array<Outcome<DrainResult>>;
          list.push(o);
          runs.set(system, list);
        } else {
          const o = await runTask<EnqueueResult>({ kind: 'enqueue', system, ctx, params: enqueueParams }, taskTimeout);
          show(system, o, (v) => `single ${Math.round(v.single.jobsPerSecond)} jobs/s, bulk ${Math.round(v.bulk.jobsPerSecond)} jobs/s`);
          const list = (runs.get(system) ?? []) as Array<Outcome<EnqueueResult>>;
          list.push(o);
          runs.set(system, list);
        }
      }
    }
    for (const [system, list] of runs) {
      if (workload === 'drain') results.drain[system] = summarizeDrain(list as Array<Outcome<DrainResult>>);
      else results.enqueue[system] = summarizeEnqueue(list as Array<Outcome<EnqueueResult>>);
    }
  }

  if (config.workloads.includes('latency')) {
    log('latency');
    for (const system of config.systems) {
      const o = await runTask<LatencyResult>({
        kind: 'latency',
        system,
        ctx: ctxFor(config, 'latency'),
        params: { rate: config.rate, jobs: config.latencyJobs, concurrency: config.concurrency, idleMs: config.idleMs },
      }, taskTimeout);
      results.latency[system] = o;
      show(system, o, (v) => `p50 ${v.p50Ms.toFixed(2)} ms, p99 ${v.p99Ms.toFixed(2)} ms, max ${v.maxMs.toFixed(1)} ms${v.missing ? `, ${v.missing} missing` : ''}`);
    }
  }

  if (config.workloads.includes('scale') && config.systems.includes('mailroom')) {
    log('scale (mailroom)');
    const scaleTask = (processes: number, jobs: number, label: string, orderingKeys?: number): Task => ({
      kind: 'scale',
      params: {
        serverUrl: config.serverUrl,
        tag: `${runId}_scale_${label}`,
        processes,
        jobs,
        concurrency: config.concurrency,
        batch: Math.max(config.batch, 5000),
        timeoutMs: config.timeoutMs,
        warmUpJobs: config.scaleWarmUp,
        ...(orderingKeys ? { orderingKeys } : {}),
      },
    });
    for (const p of config.processes) {
      const o = await runTask<ScaleResult>(scaleTask(p, config.scaleJobs, `p${p}`), taskTimeout);
      results.scale.processes.push(o);
      show(`${p} process(es), ${config.scaleJobs} jobs`, o, (v) => `${Math.round(v.jobsPerSecond)} jobs/s (steady ${Math.round(v.steadyJobsPerSecond)})`);
    }
    if (config.orderingKeys > 0) {
      const o = await runTask<ScaleResult>(scaleTask(1, config.scaleJobs, 'ordered', config.orderingKeys), taskTimeout);
      results.scale.ordered = o;
      show(`1 process, ${config.orderingKeys} ordering keys`, o, (v) => `${Math.round(v.jobsPerSecond)} jobs/s (steady ${Math.round(v.steadyJobsPerSecond)})`);
    }
    // Rounds interleaved (each round drains every backlog once), so that the machine's drift over
    // the run weighs on every backlog alike, as the drain's rounds pair the systems.
    const backlogRounds = config.backlogs.map((): Array<Outcome<ScaleResult>> => []);
    for (let round = 1; round <= config.rounds; round++) {
      for (const [i, b] of config.backlogs.entries()) {
        const o = await runTask<ScaleResult>(scaleTask(1, b, `b${b}_r${round}`), taskTimeout);
        backlogRounds[i]!.push(o);
        show(`backlog ${b}${config.rounds > 1 ? `, round ${round}` : ''}`, o, (v) => `${Math.round(v.jobsPerSecond)} jobs/s, steady ${Math.round(v.steadyJobsPerSecond)} jobs/s (enqueue ${v.enqueueSeconds.toFixed(1)} s)`);
      }
    }
    for (const rounds of backlogRounds) results.scale.backlogs.push(summarizeScale(rounds));
  }

  const left = await dropLeftovers(config.serverUrl, runId).catch(() => []);
  await putAutovacuumBack();
  if (left.length > 0) log(`dropped databases a failed teardown left behind: ${left.join(', ')}`);
  results.machine.loadAtEnd = os.loadavg().map((v) => Math.round(v * 100) / 100);
  results.seconds = (now() - started) / 1000;
  const text = report(results);
  const json = JSON.stringify(results, null, 2);
  if (config.out) await writeFile(config.out, `${json}\n`);
  if (config.json) {
    log(`\n${text}`);
    process.stdout.write(`${json}\n`);
  } else process.stdout.write(`\n${text}\n`);
  const failed = [
    ...Object.values(results.drain),
    ...Object.values(results.enqueue),
    ...Object.values(results.latency),
    ...results.scale.processes,
    ...(results.scale.ordered ? [results.scale.ordered] : []),
    ...results.scale.backlogs,
    ...(results.ceiling ? [results.ceiling] : []),
  ].filter((o) => o && !o.ok).length;
  if (failed > 0) {
    log(`${failed} measurement(s) failed (see above)`);
    process.exitCode = 1;
  }
}

async function putAutovacuumBack(): Promise<void> {
  const restore = restoreAutovacuum;
  restoreAutovacuum = undefined;
  await restore?.().catch((error: unknown) => log(`could not reset autovacuum (ALTER SYSTEM RESET autovacuum): ${String(error)}`));
}

async function interrupted(signal: NodeJS.Signals): Promise<void> {
  log(`\n${signal}: stopping; dropping this run's databases (${runId}_*)`);
  for (const c of children) c.kill('SIGKILL');
  await putAutovacuumBack();
  try {
    const dropped = await dropLeftovers(parseArgsSafe().serverUrl, runId);
    if (dropped.length > 0) log(`dropped ${dropped.join(', ')}`);
  } catch (error) {
    log(`could not drop them: ${error instanceof Error ? error.message : String(error)}`);
  }
  process.exit(130);
}

function parseArgsSafe(): BenchConfig {
  const c = parseArgs(process.argv.slice(2));
  if (c === 'help') throw new Error('unreachable');
  return c;
}

process.once('SIGINT', (s) => void interrupted(s));
process.once('SIGTERM', (s) => void interrupted(s));
main().catch(async (error: unknown) => {
  log(error instanceof Error ? (error.stack ?? error.message) : String(error));
  await putAutovacuumBack();
  process.exitCode = 1;
});
