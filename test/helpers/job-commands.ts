/**
 * fast-check commands that drive the real job state machine (the statements a
 * worker runs, and the public API) next to the in-memory model of
 * test/helpers/job-model.ts, and compare both after every command.
 */
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { PermanentError, RetryableError, type JobDefinition, type Mailroom } from '../../src/index.ts';
import type { JobQueries } from '../../src/jobs/queries.ts';
import type { Driver } from '../../src/storage/driver.ts';
import type { ClaimedRow } from '../../src/worker/types.ts';
import { decideFailure } from '../../src/worker/execute.ts';
import { completeInTransaction, HandlerTransaction } from '../../src/worker/handler-tx.ts';
import { isUnfinished, isWaiting, type FailureKind, type JobModel, type ModelJob, type ModelToken, type ModelType } from './job-model.ts';

export const MODEL_QUEUE = 'model';
const LEASE_MS = 3_600_000;
const LATER_MS = 3_600_000;

/** The real system under test: one schema, the worker's statements, and two mailrooms on it. */
export interface RealSystem {
  /** Retention that keeps everything (and, in one variant, a dedup key window). */
  mailroom: Mailroom;
  /** The same schema with retention that prunes every finished job older than 1 s. */
  pruner: Mailroom;
  driver: Driver;
  queries: JobQueries;
  /** The quoted schema, for the test's own SQL. */
  s: string;
  sql<R = Record<string, unknown>>(text: string, params?: unknown[]): Promise<R[]>;
  defs: Record<ModelType, JobDefinition<{ n: number }, { n: number }>>;
  /** The rows each claim returned, by `id:claim`: what a worker holds in memory. */
  claims: Map<string, ClaimedRow>;
}

type Command = fc.AsyncCommand<JobModel, RealSystem>;

const tokenKey = (t: ModelToken): string => `${t.id}:${t.claim}`;
const pickFrom = <T>(list: readonly T[], pick: number): T => list[pick % list.length]!;

function errorOf(kind: FailureKind): Error {
  if (kind === 'permanent') return new PermanentError('model: permanent failure');
  if (kind === 'later') return new RetryableError('model: try again in an hour', { after: '1h' });
  return new Error('model: transient failure');
}

export class Enqueue implements Command {
  constructor(
    readonly type: ModelType,
    readonly key: string | null,
    readonly orderingKey: string | null,
    readonly delayed: boolean,
  ) {}
  check(): boolean {
    return true;
  }
  async run(m: JobModel, r: RealSystem): Promise<void> {
    const expected = m.dedupOf(this.type, this.key);
    const id = await r.mailroom.enqueue(
      r.defs[this.type],
      { n: m.allIds().length },
      {
        ...(this.key !== null ? { key: this.key } : {}),
        ...(this.orderingKey !== null ? { orderingKey: this.orderingKey } : {}),
        ...(this.delayed ? { delay: '1h' } : {}),
      },
    );
    if (expected) assert.ok(expected.includes(id), `enqueue with key ${this.key} must return ${expected.join(' or ')}, got ${id}`);
    else {
      assert.ok(!m.allIds().includes(id), `enqueue returned the id of an earlier job ${id}, expected a new job`);
      m.enqueued(id, this.type, this.key, this.orderingKey, this.delayed);
    }
    await compare(m, r, [id]);
  }
  toString(): string {
    return `enqueue(${this.type}, key=${this.key}, orderingKey=${this.orderingKey}${this.delayed ? ', delay 1h' : ''})`;
  }
}

export class Claim implements Command {
  constructor(readonly n: number) {}
  check(): boolean {
    return true;
  }
  async run(m: JobModel, r: RealSystem): Promise<void> {
    const claimable = m.claimable();
    const { rows } = await r.driver.run<ClaimedRow>(r.queries.claim, [MODEL_QUEUE, this.n, LEASE_MS, 'model-worker']);
    assert.equal(rows.length, Math.min(this.n, claimable.length), `claim(${this.n}) with ${claimable.length} claimable jobs`);
    // The claimed jobs are the first of the claimable ones by priority, run_at, id (read from the database:
    // the model has no clock, and on PGlite now() has a millisecond's resolution).
    const order = await r.sql<{ id: string }>(`SELECT id FROM ${r.s}.jobs WHERE id = ANY($1::uuid[]) ORDER BY priority DESC, run_at, id`, [
      claimable.map((j) => j.id),
    ]);
    const expected = order.slice(0, rows.length).map((o) => o.id);
    assert.deepEqual(rows.map((row) => row.id).sort(), [...expected].sort(), 'claim took jobs out of order or jobs that are not claimable');
    for (const row of rows) {
      const job = m.job(row.id)!;
      const token = m.claimed(job);
      assert.equal(row.claim_count, token.claim, `claim token of ${row.id}`);
      assert.equal(row.attempt, job.attempt, `attempt of ${row.id}`);
      assert.equal(row.max_attempts, job.maxAttempts, `max attempts of ${row.id}`);
      r.claims.set(tokenKey(token), row);
    }
    await compare(m, r, rows.map((row) => row.id));
  }
  toString(): string {
    return `claim(${this.n})`;
  }
}

/** A command on one claim handed out earlier: current or stale (fencing decides). */
abstract class OnToken implements Command {
  constructor(readonly pick: number) {}
  check(m: Readonly<JobModel>): boolean {
    return m.tokens.length > 0;
  }
  abstract run(m: JobModel, r: RealSystem): Promise<void>;
  protected token(m: JobModel): ModelToken {
    return pickFrom(m.tokens, this.pick);
  }
  abstract toString(): string;
}

export class Complete extends OnToken {
  constructor(
    pick: number,
    readonly viaTx: boolean,
  ) {
    super(pick);
  }
  async run(m: JobModel, r: RealSystem): Promise<void> {
    const token = this.token(m);
    const owner = m.owner(token);
    let recorded: boolean;
    if (this.viaTx) {
      // The ctx.tx path: the handler's write and the fenced completion commit together or not at all.
      const tx = new HandlerTransaction(r.driver, token.id, LEASE_MS);
      await tx.queryable.query(`INSERT INTO ${r.s}.model_effects (job_id, claim) VALUES ($1, $2)`, [token.id, token.claim]);
      recorded = await tx.commitWith(completeInTransaction(r.queries, token.id, token.claim));
    } else {
      const { rows } = await r.driver.run<{ id: string }>(r.queries.complete, [[token.id], [token.claim]]);
      recorded = rows.length === 1;
    }
    assert.equal(recorded, owner !== undefined, owner ? 'the owner of the claim could not complete its job' : 'a stale claim completed the job');
    if (owner) {
      m.completed(owner);
      if (this.viaTx) m.effects.push(tokenKey(token));
    }
    await compare(m, r, [token.id]);
  }
  toString(): string {
    return `complete(token #${this.pick}${this.viaTx ? ', in ctx.tx' : ''})`;
  }
}

export class Fail extends OnToken {
  constructor(
    pick: number,
    readonly kind: FailureKind,
  ) {
    super(pick);
  }
  async run(m: JobModel, r: RealSystem): Promise<void> {
    const token = this.token(m);
    const owner = m.owner(token);
    const row = r.claims.get(tokenKey(token))!;
    // What the worker does: classify with the job type's policy, then one fenced statement.
    const outcome = decideFailure(row, errorOf(this.kind), () => 0);
    const { rows } = await r.driver.run<{ state: string }>(r.queries.fail, [
      row.id,
      row.claim_count,
      outcome.retry,
      outcome.delayMs,
      outcome.deadReason,
      outcome.category,
      outcome.message,
      outcome.stack,
    ]);
    assert.equal(rows.length, owner ? 1 : 0, owner ? 'the owner of the claim could not fail its job' : 'a stale claim failed the job');
    if (owner) {
      m.failed(owner, this.kind);
      assert.equal(rows[0]!.state, owner.state, 'the state the fail statement reports');
    }
    await compare(m, r, [token.id]);
  }
  toString(): string {
    return `fail(token #${this.pick}, ${this.kind})`;
  }
}

export class Snooze extends OnToken {
  constructor(
    pick: number,
    readonly later: boolean,
  ) {
    super(pick);
  }
  async run(m: JobModel, r: RealSystem): Promise<void> {
    const token = this.token(m);
    const owner = m.owner(token);
    const { rowCount } = await r.driver.run(r.queries.reschedule, [token.id, token.claim, this.later ? LATER_MS : 0, null, 'snoozed']);
    assert.equal(rowCount, owner ? 1 : 0, owner ? 'the owner could not snooze its job' : 'a stale claim snoozed the job');
    if (owner) m.rescheduled(owner, this.later);
    await compare(m, r, [token.id]);
  }
  toString(): string {
    return `snooze(token #${this.pick}, ${this.later ? '1h' : 'now'})`;
  }
}

export class Heartbeat extends OnToken {
  async run(m: JobModel, r: RealSystem): Promise<void> {
    const token = this.token(m);
    const owner = m.owner(token);
    const { rows } = await r.driver.run<{ id: string }>(r.queries.heartbeat, [[token.id], [token.claim], LEASE_MS]);
    assert.equal(rows.length, owner ? 1 : 0, owner ? 'the owner could not renew its lease' : 'a stale claim renewed the lease');
    if (owner) owner.expired = false;
    await compare(m, r, [token.id]);
  }
  toString(): string {
    return `heartbeat(token #${this.pick})`;
  }
}

/** A command on one job: `among` chooses the candidates. */
abstract class OnJob implements Command {
  constructor(readonly pick: number) {}
  abstract candidates(m: Readonly<JobModel>): string[];
  check(m: Readonly<JobModel>): boolean {
    return this.candidates(m).length > 0;
  }
  protected id(m: JobModel): string {
    return pickFrom(this.candidates(m), this.pick);
  }
  abstract run(m: JobModel, r: RealSystem): Promise<void>;
  abstract toString(): string;
}

export class ExpireLease extends OnJob {
  candidates(m: Readonly<JobModel>): string[] {
    return m.jobs.filter((j) => j.state === 'active' && !j.expired).map((j) => j.id);
  }
  async run(m: JobModel, r: RealSystem): Promise<void> {
    const id = this.id(m);
    // The worker stopped renewing (paused, killed, cut off) and the lease ran out.
    await r.sql(`UPDATE ${r.s}.jobs SET locked_until = now() - interval '1 second' WHERE id = $1`, [id]);
    m.job(id)!.expired = true;
    await compare(m, r, [id]);
  }
  toString(): string {
    return `expireLease(job #${this.pick})`;
  }
}

export class MakeDue extends OnJob {
  candidates(m: Readonly<JobModel>): string[] {
    return m.jobs.filter((j) => isWaiting(j.state) && !j.due).map((j) => j.id);
  }
  async run(m: JobModel, r: RealSystem): Promise<void> {
    const id = this.id(m);
    // Time passes for this job: its delay (or backoff, or snooze) is over.
    await r.sql(`UPDATE ${r.s}.jobs SET run_at = now() WHERE id = $1`, [id]);
    m.madeDue(m.job(id)!);
    await compare(m, r, [id]);
  }
  toString(): string {
    return `makeDue(job #${this.pick})`;
  }
}

export class Cancel extends OnJob {
  candidates(m: Readonly<JobModel>): string[] {
    return m.allIds();
  }
  async run(m: JobModel, r: RealSystem): Promise<void> {
    const id = this.id(m);
    const job = m.job(id);
    const result = await r.mailroom.jobs.cancel(id);
    if (!job) assert.deepEqual(result, { changed: false, state: undefined });
    else if (m.cancel(job)) assert.deepEqual(result, { changed: true, state: 'cancelled' });
    else assert.deepEqual(result, { changed: false, state: job.state });
    await compare(m, r, [id]);
  }
  toString(): string {
    return `cancel(job #${this.pick})`;
  }
}

export class Retry extends OnJob {
  candidates(m: Readonly<JobModel>): string[] {
    return m.allIds();
  }
  async run(m: JobModel, r: RealSystem): Promise<void> {
    const id = this.id(m);
    const job = m.job(id);
    const holder = job && (job.state === 'dead' || job.state === 'cancelled') ? m.keyHolder(job.type, job.key, job) : undefined;
    if (job && holder) {
      // Its dedup key belongs to an unfinished job now: a clear refusal, nothing changed.
      await assert.rejects(r.mailroom.jobs.retry(id), (e: Error) => e.message.includes(holder.id) && e.message.includes(`"${job.key}"`));
    } else {
      const result = await r.mailroom.jobs.retry(id);
      if (!job) assert.deepEqual(result, { changed: false, state: undefined });
      else if (isWaiting(job.state) || job.state === 'dead' || job.state === 'cancelled') {
        m.retried(job);
        assert.deepEqual(result, { changed: true, state: 'available' });
      } else assert.deepEqual(result, { changed: false, state: job.state });
    }
    await compare(m, r, [id]);
  }
  toString(): string {
    return `retry(job #${this.pick})`;
  }
}

export class ReplayOne extends OnJob {
  candidates(m: Readonly<JobModel>): string[] {
    return m.allIds();
  }
  async run(m: JobModel, r: RealSystem): Promise<void> {
    const id = this.id(m);
    const job = m.job(id);
    const result = await r.mailroom.deadLetters.replay({ ids: [id] });
    if (!job || job.state !== 'dead') {
      assert.deepEqual([result.matched, result.replayed, result.skipped, result.notFound], [0, 0, 0, [id]]);
    } else if (m.keyHolder(job.type, job.key, job)) {
      assert.deepEqual([result.matched, result.replayed, result.skipped, result.notFound], [1, 0, 1, []]);
    } else {
      assert.deepEqual([result.matched, result.replayed, result.skipped, result.notFound], [1, 1, 0, []]);
      m.retried(job);
    }
    await compare(m, r, [id]);
  }
  toString(): string {
    return `replay(ids: [job #${this.pick}])`;
  }
}

export class ReplayAll implements Command {
  check(m: Readonly<JobModel>): boolean {
    return m.jobs.some((j) => j.state === 'dead');
  }
  async run(m: JobModel, r: RealSystem): Promise<void> {
    const dead = m.jobs.filter((j) => j.state === 'dead');
    const held = dead.filter((j) => m.keyHolder(j.type, j.key, j));
    // Of several dead jobs sharing a free dedup key only one can be replayed; the rest stay dead (skipped).
    const groups = new Map<string, ModelJob[]>();
    for (const j of dead) {
      if (held.includes(j)) continue;
      const group = j.key === null ? `id:${j.id}` : `key:${j.type}:${j.key}`;
      groups.set(group, [...(groups.get(group) ?? []), j]);
    }
    const result = await r.mailroom.deadLetters.replay({ queue: MODEL_QUEUE });
    assert.equal(result.matched, dead.length, 'dead letters matched');
    assert.equal(result.replayed, groups.size, 'dead letters replayed');
    assert.equal(result.skipped, dead.length - groups.size, 'dead letters skipped (dedup key held)');
    // Which one of a key's dead jobs is replayed, and the order in which jobs of one ordering key
    // queue again, follow the database's order (finished_at, on PGlite at a millisecond's resolution):
    // read it, check it is a valid choice, and apply it to the model in that order.
    const replayed = await r.sql<{ id: string }>(
      `SELECT id FROM ${r.s}.jobs WHERE id = ANY($1::uuid[]) AND state = 'available' ORDER BY ordering_seq NULLS FIRST, id`,
      [dead.map((j) => j.id)],
    );
    for (const [group, jobs] of groups) {
      const chosen = jobs.filter((j) => replayed.some((row) => row.id === j.id));
      assert.equal(chosen.length, 1, `exactly one dead job of ${group} replayed`);
    }
    for (const { id } of replayed) m.retried(m.job(id)!);
    await compare(m, r, dead.map((j) => j.id));
  }
  toString(): string {
    return `replay({ queue: '${MODEL_QUEUE}' })`;
  }
}

export class Maintain implements Command {
  check(): boolean {
    return true;
  }
  async run(m: JobModel, r: RealSystem): Promise<void> {
    const result = await r.mailroom.maintain();
    const rescued = m.rescue();
    assert.deepEqual({ rescued: result.rescued, pruned: result.pruned }, { rescued: rescued.length, pruned: 0 });
    await compare(m, r, rescued.map((j) => j.id));
  }
  toString(): string {
    return 'maintain()';
  }
}

export class Prune implements Command {
  check(): boolean {
    return true;
  }
  async run(m: JobModel, r: RealSystem): Promise<void> {
    // Two seconds pass for every finished job; then maintenance with a 1 s retention runs.
    await r.sql(`UPDATE ${r.s}.jobs SET finished_at = finished_at - interval '2 seconds' WHERE finished_at IS NOT NULL`);
    const finished = new Set(m.jobs.filter((j) => !isUnfinished(j.state)).map((j) => j.id));
    const result = await r.pruner.maintain();
    const rescued = m.rescue(); // maintenance rescues first; what it rescues just now is not old enough to go
    const pruned = m.prune((j) => finished.has(j.id));
    assert.deepEqual({ rescued: result.rescued, pruned: result.pruned }, { rescued: rescued.length, pruned });
    await compare(m, r, [...finished]);
  }
  toString(): string {
    return 'prune()';
  }
}

/**
 * Every command, weighted (listed several times) so that jobs are made and claimed often and
 * wiped out by pruning rarely; value spaces are small so that keys collide.
 */
export function jobCommands(): fc.Arbitrary<Command>[] {
  const type = fc.constantFrom<ModelType>('plain', 'plain', 'hold');
  const key = fc.constantFrom<string | null>(null, 'k1', 'k1', 'k2');
  const orderingKey = fc.constantFrom<string | null>(null, null, 'o1', 'o1', 'o2');
  const pick = fc.nat({ max: 50 });
  const times = <T>(n: number, arb: fc.Arbitrary<T>): fc.Arbitrary<T>[] => new Array<fc.Arbitrary<T>>(n).fill(arb);
  return [
    ...times(5, fc.tuple(type, key, orderingKey, fc.constantFrom(false, false, false, true)).map(([t, k, o, d]) => new Enqueue(t, k, o, d))),
    ...times(4, fc.integer({ min: 1, max: 3 }).map((n) => new Claim(n))),
    ...times(2, fc.tuple(pick, fc.boolean()).map(([p, tx]) => new Complete(p, tx))),
    ...times(3, fc.tuple(pick, fc.constantFrom<FailureKind>('transient', 'later', 'permanent', 'permanent')).map(([p, k]) => new Fail(p, k))),
    fc.tuple(pick, fc.boolean()).map(([p, later]) => new Snooze(p, later)),
    pick.map((p) => new Heartbeat(p)),
    ...times(2, pick.map((p) => new ExpireLease(p))),
    pick.map((p) => new MakeDue(p)),
    pick.map((p) => new Cancel(p)),
    ...times(2, pick.map((p) => new Retry(p))),
    pick.map((p) => new ReplayOne(p)),
    fc.constant(new ReplayAll()),
    ...times(2, fc.constant(new Maintain())),
    fc.constant(new Prune()),
  ];
}

interface RealRow {
  id: string;
  state: string;
  attempt: number;
  max_attempts: number;
  claim_count: number;
  blocked: boolean;
  dedup_key: string | null;
  ordering_key: string | null;
  dead_reason: string | null;
  due: boolean;
  expired: boolean | null;
  category: string | null;
  errors: number;
}

function view(j: { state: string; attempt: number; maxAttempts: number; claim: number; blocked: boolean; key: string | null; orderingKey: string | null; deadReason: string | null; category: string | null; errors: number; due: boolean; expired: boolean | null }) {
  return {
    state: j.state,
    attempt: j.attempt,
    maxAttempts: j.maxAttempts,
    claim: j.claim,
    blocked: j.blocked,
    key: j.key,
    orderingKey: j.orderingKey,
    deadReason: j.deadReason,
    category: j.category,
    errors: j.errors,
    due: isWaiting(j.state as ModelJob['state']) ? j.due : null,
    expired: j.state === 'active' ? j.expired : null,
  };
}

/** Compares every job, the queue's stats, the ctx.tx effects and the touched jobs' `jobs.get` with the model. */
export async function compare(m: JobModel, r: RealSystem, touched: string[]): Promise<void> {
  const rows = await r.sql<RealRow>(
    `SELECT id, state, attempt, max_attempts, claim_count, blocked, dedup_key, ordering_key, dead_reason,
            run_at <= now() AS due, locked_until < now() AS expired, last_error->>'category' AS category,
            (SELECT count(*)::int FROM ${r.s}.job_errors AS e WHERE e.job_id = j.id) AS errors
       FROM ${r.s}.jobs AS j ORDER BY id`,
  );
  const real = Object.fromEntries(
    rows.map((row) => [
      row.id,
      view({ ...row, maxAttempts: row.max_attempts, claim: row.claim_count, key: row.dedup_key, orderingKey: row.ordering_key, deadReason: row.dead_reason, expired: row.expired }),
    ]),
  );
  const modelled = Object.fromEntries(
    [...m.jobs].sort((a, b) => (a.id < b.id ? -1 : 1)).map((j) => [j.id, view({ ...j, category: j.lastCategory })]),
  );
  assert.deepEqual(real, modelled, 'jobs in the database differ from the model');

  const [stats, effects, holders] = await Promise.all([
    r.mailroom.stats(),
    r.sql<{ token: string }>(`SELECT job_id || ':' || claim AS token FROM ${r.s}.model_effects ORDER BY 1`),
    // Independent of the model: one unblocked holder per ordering key at most.
    r.sql<{ key: string; n: number }>(
      `SELECT ordering_key AS key, count(*)::int AS n FROM ${r.s}.jobs
        WHERE ordering_key IS NOT NULL AND NOT blocked
          AND (state IN ('scheduled', 'available', 'active', 'retrying') OR (state = 'dead' AND hold_key_when_dead))
        GROUP BY ordering_key HAVING count(*) > 1`,
    ),
  ]);
  assert.deepEqual(holders, [], 'more than one job holds an ordering key');
  assert.deepEqual(effects.map((e) => e.token), [...m.effects].sort(), 'ctx.tx effects differ from the completions the model accepted');
  // A queue with no job in these states has no counts (it may still be listed, for its rates).
  const q = stats.queues[MODEL_QUEUE] ?? { available: 0, scheduled: 0, retrying: 0, blocked: 0, active: 0, dead: 0 };
  const count = (f: (j: ModelJob) => boolean) => m.jobs.filter(f).length;
  assert.deepEqual(
    { available: q.available, scheduled: q.scheduled, retrying: q.retrying, blocked: q.blocked, active: q.active, dead: q.dead },
    {
      available: count((j) => isWaiting(j.state) && !j.blocked && j.due),
      scheduled: count((j) => j.state === 'scheduled' && !j.blocked && !j.due),
      retrying: count((j) => j.state === 'retrying' && !j.blocked && !j.due),
      blocked: count((j) => isWaiting(j.state) && j.blocked),
      active: count((j) => j.state === 'active'),
      dead: count((j) => j.state === 'dead'),
    },
    'stats() differs from the model',
  );

  for (const id of new Set(touched)) {
    const info = await r.mailroom.jobs.get(id);
    const job = m.job(id);
    if (!job) {
      assert.equal(info, undefined, `jobs.get(${id}) of a pruned job`);
      continue;
    }
    assert.ok(info, `jobs.get(${id}) found nothing`);
    assert.deepEqual(
      { state: info.state, attempts: info.attempts, maxAttempts: info.maxAttempts, key: info.key, orderingKey: info.orderingKey, deadReason: info.deadReason, category: info.lastError?.category ?? null, errors: info.errors.length },
      { state: job.state, attempts: job.attempt, maxAttempts: job.maxAttempts, key: job.key, orderingKey: job.orderingKey, deadReason: job.deadReason, category: job.lastCategory, errors: job.errors },
      `jobs.get(${id})`,
    );
  }
}
