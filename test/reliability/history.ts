/**
 * The history checker of the reliability suite (docs/RELIABILITY.md).
 *
 * Three records make a history:
 * - operations, logged by the workload: each enqueue or publish is `invoked`,
 *   then ends `ok` (its transaction committed), `failed` (it certainly did not
 *   commit: a statement before COMMIT failed), `rolled-back` (the workload
 *   rolled it back on purpose) or `unknown` (COMMIT itself failed or timed out:
 *   it may or may not have committed);
 * - runs (`h_runs`), written by handlers on their own autocommit connection:
 *   every handler run that got that far, killed, failed and fenced-off runs
 *   included. Deliveries, not effects;
 * - effects (`h_effects`), written by handlers through `ctx.tx`: they commit
 *   only with the job's fenced completion, so they are what took effect.
 * Plus mailroom's own fencing data: each job's final state and attempt, and
 * the claims that were rescued after their lease expired.
 *
 * {@link checkHistory} is a pure function of that history, so it is tested on
 * hand-made histories (test/reliability-checker.test.ts); {@link readHistory}
 * reads the database part after a drained run.
 */
import type pg from 'pg';
import { historyQueries } from './history-queries.ts';

export type OpKind = 'enqueue' | 'publish';
export type OpOutcome = 'ok' | 'failed' | 'rolled-back' | 'unknown';

/** One logged operation: a job enqueued or an event published. */
export interface Op {
  /** The operation's own id, carried in the payload and recorded by every run and effect. */
  id: string;
  kind: OpKind;
  /** Where it must take effect: the job's queue, or each consumer group of the event. */
  destinations: string[];
  /** Ordering key (job) or event key; null: no order expected. */
  key: string | null;
  /** Position in its key's sequence; a key's operations are invoked one transaction after the other. */
  seq: number | null;
  /** The workload's number of the transaction it was invoked in (transactions are numbered as they begin). */
  tx?: number;
  /** Undefined while invoked (a workload that never finished an op: the checker treats it as unknown). */
  outcome?: OpOutcome;
  /** Why it failed or is unknown. */
  error?: string;
}

/** A handler run (`h_runs`). */
export interface Run {
  id: string;
  dest: string;
  op: string;
  job_id: string;
  attempt: number;
  pid: number;
}

/** A committed effect (`h_effects`), in commit order of its key (ordered by `id`). */
export interface Effect {
  id: number;
  run_id: string;
  dest: string;
  op: string;
  key: string | null;
  seq: number | null;
  job_id: string;
  attempt: number;
  pid: number;
}

/** Fencing data of a job: its final state and the attempt of its last claim. */
export interface JobRecord {
  id: string;
  queue: string;
  state: string;
  attempt: number;
  claim_count: number;
}

/** A claim whose lease expired and was taken over (`job_errors`, category `lease-expired`). */
export interface RescuedClaim {
  job_id: string;
  claim: number;
  attempt: number;
}

export interface History {
  ops: Op[];
  runs: Run[];
  effects: Effect[];
  jobs: JobRecord[];
  rescued: RescuedClaim[];
}

export interface Violation {
  kind: 'lost' | 'unexpected' | 'duplicated' | 'rolled-back' | 'order' | 'stale';
  op: string;
  dest: string;
  detail: string;
}

export interface CheckReport {
  ok: boolean;
  /** Operations by outcome. */
  ops: Record<OpOutcome, number>;
  /** (op, destination) pairs that had to take effect (outcome ok). */
  expected: number;
  effects: number;
  runs: number;
  lost: number;
  unexpected: number;
  duplicated: number;
  rolledBack: number;
  orderViolations: number;
  staleCompletions: number;
  /** Runs beyond the first per (op, destination): redeliveries and retries. Allowed. */
  duplicateDeliveries: number;
  /** `unknown` operations that took effect / did not (either is allowed, once). */
  unknownApplied: number;
  unknownNotApplied: number;
  /** The first violations of each kind (at most 5 each), for the failure message. */
  violations: Violation[];
}

const pairKey = (op: string, dest: string) => `${op}\u0000${dest}`;

/**
 * Checks a complete, drained history: every `ok` operation took effect exactly
 * once at each destination, `unknown` ones at most once, `failed` and
 * `rolled-back` ones never; no effect of an operation nobody invoked; per
 * (destination, key) the effects of `ok` operations in their invocation
 * order; every effect committed by the claim that completed its job and that
 * was never taken over. `ok` is true when every count is zero.
 *
 * @example
 * const report = checkHistory({ ops: log.ops(), ...(await readHistory(pool, schema)) });
 * assert.ok(report.ok, JSON.stringify(report.violations));
 */
export function checkHistory(history: History): CheckReport {
  const violations: Violation[] = [];
  const counts = { lost: 0, unexpected: 0, duplicated: 0, rolledBack: 0, orderViolations: 0, staleCompletions: 0 };
  const shown: Record<string, number> = {};
  const report = (v: Violation, counter: keyof typeof counts, n = 1) => {
    counts[counter] += n;
    shown[v.kind] = (shown[v.kind] ?? 0) + 1;
    if (shown[v.kind]! <= 5) violations.push(v);
  };

  const ops = new Map(history.ops.map((op) => [op.id, op]));
  const outcomeOf = (op: Op): OpOutcome => op.outcome ?? 'unknown';
  const opCounts: Record<OpOutcome, number> = { ok: 0, failed: 0, 'rolled-back': 0, unknown: 0 };
  for (const op of history.ops) opCounts[outcomeOf(op)]++;

  const effectsByPair = new Map<string, Effect[]>();
  for (const e of history.effects) {
    const k = pairKey(e.op, e.dest);
    effectsByPair.set(k, [...(effectsByPair.get(k) ?? []), e]);
  }
  const runsByPair = new Map<string, number>();
  for (const r of history.runs) runsByPair.set(pairKey(r.op, r.dest), (runsByPair.get(pairKey(r.op, r.dest)) ?? 0) + 1);

  // Per operation and destination: lost, duplicated, effects of rolled-back or failed work.
  let expected = 0;
  let unknownApplied = 0;
  let unknownNotApplied = 0;
  for (const op of history.ops) {
    const outcome = outcomeOf(op);
    for (const dest of op.destinations) {
      const applied = effectsByPair.get(pairKey(op.id, dest)) ?? [];
      if (outcome === 'ok') {
        expected++;
        if (applied.length === 0) report({ kind: 'lost', op: op.id, dest, detail: `committed ${op.kind} never took effect (runs: ${runsByPair.get(pairKey(op.id, dest)) ?? 0})` }, 'lost');
      }
      if (outcome === 'unknown') {
        if (applied.length > 0) unknownApplied++;
        else unknownNotApplied++;
      }
      if ((outcome === 'failed' || outcome === 'rolled-back') && applied.length > 0) {
        report({ kind: 'rolled-back', op: op.id, dest, detail: `${outcome} ${op.kind} took effect ${applied.length} time(s)${op.error ? ` (${op.error})` : ''}` }, 'rolledBack');
      }
      if (applied.length > 1) {
        report({ kind: 'duplicated', op: op.id, dest, detail: `took effect ${applied.length} times (effects ${applied.map((e) => `#${e.id} attempt ${e.attempt} pid ${e.pid}`).join(', ')})` }, 'duplicated', applied.length - 1);
      }
    }
  }

  // Effects nobody asked for: an unknown operation, or a destination it was not sent to.
  for (const e of history.effects) {
    const op = ops.get(e.op);
    if (!op) report({ kind: 'unexpected', op: e.op, dest: e.dest, detail: `effect #${e.id} of an operation never invoked` }, 'unexpected');
    else if (!op.destinations.includes(e.dest)) report({ kind: 'unexpected', op: e.op, dest: e.dest, detail: `effect #${e.id} at a destination the ${op.kind} was not sent to (${op.destinations.join(', ')})` }, 'unexpected');
  }

  // Per (destination, key): effects of ok operations in invocation order. Operations of one key are
  // invoked one transaction after the other, so an ok one committed before the next began; an unknown
  // one may commit late (its COMMIT was in flight), so only ok ones are ordered. Duplicates are counted above.
  const lastSeq = new Map<string, { seq: number; effect: number }>();
  for (const e of history.effects) {
    const op = ops.get(e.op);
    if (!op || outcomeOf(op) !== 'ok' || e.key === null || e.seq === null) continue;
    const k = pairKey(e.key, e.dest);
    const last = lastSeq.get(k);
    if (last && e.seq < last.seq) {
      report({ kind: 'order', op: e.op, dest: e.dest, detail: `key ${e.key}: seq ${e.seq} (effect #${e.id}) took effect after seq ${last.seq} (effect #${last.effect})` }, 'orderViolations');
    }
    if (!last || e.seq > last.seq) lastSeq.set(k, { seq: e.seq, effect: e.id });
  }

  // Stale completions: an effect commits only with its job's completion, so it must come from the
  // claim that completed the job, and that claim must never have been taken over.
  const jobs = new Map(history.jobs.map((j) => [j.id, j]));
  const rescued = new Set(history.rescued.map((r) => `${r.job_id}/${r.attempt}`));
  for (const e of history.effects) {
    const job = jobs.get(e.job_id);
    let why: string | null = null;
    if (!job) why = `its job ${e.job_id} does not exist`;
    else if (job.state !== 'completed') why = `its job ${e.job_id} is ${job.state}, not completed`;
    else if (job.attempt !== e.attempt) why = `committed by attempt ${e.attempt}; the job was completed by attempt ${job.attempt}`;
    else if (rescued.has(`${e.job_id}/${e.attempt}`)) why = `committed by attempt ${e.attempt}, whose lease had expired and was taken over`;
    if (why) report({ kind: 'stale', op: e.op, dest: e.dest, detail: `effect #${e.id} (pid ${e.pid}): ${why}` }, 'staleCompletions');
  }

  let duplicateDeliveries = 0;
  for (const n of runsByPair.values()) duplicateDeliveries += n - 1;
  const ok = Object.values(counts).every((n) => n === 0);
  return {
    ok,
    ops: opCounts,
    expected,
    effects: history.effects.length,
    runs: history.runs.length,
    ...counts,
    duplicateDeliveries,
    unknownApplied,
    unknownNotApplied,
    violations,
  };
}

/**
 * The workload's operation log: `invoke` before the transaction, then exactly
 * one of `ok`, `failed`, `rolledBack`, `unknown` for all the operations of
 * that transaction.
 *
 * @example
 * const log = new OpLog();
 * const op = log.invoke({ kind: 'enqueue', destinations: ['rel'], key: 'k1', seq: 3 });
 * log.settle([op], 'ok');
 */
export class OpLog {
  private readonly list: Op[] = [];
  private counter = 0;

  constructor(private readonly prefix = 'op') {}

  /** Logs an operation as invoked and returns it (its `id` goes into the payload). */
  invoke(op: Omit<Op, 'id' | 'outcome' | 'error'>): Op {
    const logged: Op = { ...op, id: `${this.prefix}-${(this.counter++).toString(36)}` };
    this.list.push(logged);
    return logged;
  }

  /** Records the outcome of a transaction's operations. */
  settle(ops: readonly Op[], outcome: OpOutcome, error?: unknown): void {
    for (const op of ops) {
      if (op.outcome !== undefined) throw new Error(`operation ${op.id} was already settled as ${op.outcome}; settle each transaction once`);
      op.outcome = outcome;
      if (error !== undefined) op.error = error instanceof Error ? error.message : String(error);
    }
  }

  ops(): Op[] {
    return this.list;
  }
}

/** Reads runs, effects and fencing data of a schema (after the run is drained and its processes are gone). */
export async function readHistory(pool: pg.Pool | pg.Client, schema: string): Promise<Omit<History, 'ops'>> {
  const q = historyQueries(`"${schema}"`);
  const rows = async <R>(query: { name: string; text: string }) => (await pool.query({ name: query.name, text: query.text })).rows as R[];
  const [runs, effects, jobs, rescued] = [
    await rows<Run>(q.readRuns),
    await rows<Effect>(q.readEffects),
    await rows<JobRecord>(q.readJobs),
    await rows<RescuedClaim>(q.readLeaseExpired),
  ];
  return { runs, effects, jobs, rescued };
}
