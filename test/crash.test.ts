/**
 * Crash tests with real worker processes (guarantees 1, 2 and 3 of DESIGN.md).
 *
 * Workers run as child processes (test/fixtures/crash-worker.ts) against a real
 * PostgreSQL server (PGlite serves one process only), so they need
 * TEST_DATABASE_URL; without it the suite is skipped.
 *
 * - SIGKILL: thousands of jobs, some enqueued in transactions that roll back,
 *   workers killed at random moments and replaced until everything is done;
 *   then a checker reads the complete history (jobs, job_errors, a log of every
 *   state change written by a trigger, and a row per handler run) and counts
 *   lost, unexpected, re-claimed and unexplained jobs.
 * - SIGSTOP past the lease: a paused worker's job is rescued and claimed again;
 *   once resumed, the stale worker can neither complete nor fail it (fencing).
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { createMailroom, defineJob, type Job, type JobContext, type Mailroom, type Worker } from '../src/index.ts';
import { uniqueSchema } from './helpers/databases.ts';
import { fixtureBundle } from './helpers/fixture-bundle.ts';
import { eventually } from './helpers/events.ts';
import { killChildWorker, spawnChildWorker, type ChildWorker as FixtureChild } from './helpers/child-worker.ts';
import type { CrashWorkerConfig, CrashWorkerLine } from './fixtures/crash-worker.ts';

const url = process.env.TEST_DATABASE_URL;
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const FIXTURE = fileURLToPath(new URL('./fixtures/crash-worker.ts', import.meta.url));
/** The fixture bundled once: replacements boot in about a third of the CPU (see helpers/fixture-bundle.ts). */
const FIXTURE_JS = await fixtureBundle(FIXTURE);

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
const randomInt = (min: number, max: number) => min + Math.floor(Math.random() * (max - min + 1));

// ---------------------------------------------------------------------------
// Child worker processes
// ---------------------------------------------------------------------------

type ChildWorker = FixtureChild<CrashWorkerLine>;

const children = new Set<ChildWorker>();

/** A worker process; its stdin stays open, so it exits when this process dies without cleaning up. */
const spawnWorker = (config: CrashWorkerConfig): ChildWorker => spawnChildWorker<CrashWorkerLine>(FIXTURE_JS, config, { cwd: ROOT, registry: children, stdin: 'pipe' });

// ---------------------------------------------------------------------------

interface Payload {
  n: number;
  committed: boolean;
}

class Rollback extends Error {}

describe('crash tests with real worker processes (PostgreSQL)', { skip: url ? false : 'TEST_DATABASE_URL not set' }, () => {
  let admin: pg.Pool;
  const schemas: string[] = [];
  const mailrooms: Mailroom[] = [];

  const sql = async <R extends object = Record<string, unknown>>(text: string, params: unknown[] = []): Promise<R[]> =>
    (await admin.query(text, params)).rows as R[];

  async function openSchema(prefix: string): Promise<{ schema: string; q: string; mailroom: Mailroom }> {
    const schema = uniqueSchema(prefix);
    schemas.push(schema);
    const mailroom = await createMailroom({ database: url!, schema, poolSize: 3, rescueInterval: '100ms' });
    mailrooms.push(mailroom);
    await mailroom.migrate();
    return { schema, q: `"${schema}"`, mailroom };
  }

  before(() => {
    admin = new pg.Pool({ connectionString: url!, max: 3 });
  });

  after(async () => {
    await Promise.all([...children].map((c) => killChildWorker(c)));
    await Promise.all(mailrooms.map((m) => m.close({ timeout: 1000 }).catch(() => {})));
    for (const schema of schemas) await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => {});
    await admin.end();
  });

  it('SIGKILL at random moments loses no committed job and never runs a rolled-back one', { timeout: 150_000 }, async () => {
    const t0 = Date.now();
    const { schema, q, mailroom } = await openSchema('crash_kill');
    const TYPE = 'crash.record';
    const QUEUE = 'crash';
    const def = defineJob<Payload>(TYPE, { queue: QUEUE });
    const WORKERS = 4;
    const MIN_KILLS = 10;
    const MAX_KILLS = 25;
    /** A worker is killed only once it has run this long, so it has claimed work (and replacements are not killed while booting). */
    const MIN_UPTIME_MS = 400;
    const DEADLINE_MS = 100_000;

    // Instrumentation, in the test's own schema: a row per handler run (written
    // by the handler on its own connection), a row per effect (written by the
    // handler through ctx.tx, so it commits only with the job's completion), and
    // every state or claim change of every job (a trigger).
    await sql(`CREATE TABLE ${q}.runs (
      job_id uuid NOT NULL, worker_pid integer NOT NULL, attempt integer NOT NULL,
      started_at timestamptz NOT NULL DEFAULT now())`);
    await sql(`CREATE TABLE ${q}.effects (job_id uuid NOT NULL, worker_pid integer NOT NULL, attempt integer NOT NULL)`);
    await sql(`CREATE TABLE ${q}.transitions (
      seq bigserial PRIMARY KEY, job_id uuid NOT NULL, old_state text NOT NULL, new_state text NOT NULL,
      old_claim integer NOT NULL, new_claim integer NOT NULL, locked_by text, at timestamptz NOT NULL DEFAULT clock_timestamp())`);
    await sql(`CREATE FUNCTION ${q}.log_transitions() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        INSERT INTO ${q}.transitions (job_id, old_state, new_state, old_claim, new_claim, locked_by)
        SELECT n.id, o.state, n.state, o.claim_count, n.claim_count, n.locked_by
          FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
         WHERE o.state <> n.state OR o.claim_count <> n.claim_count;
        RETURN NULL;
      END $$`);
    await sql(`CREATE TRIGGER jobs_log_transitions AFTER UPDATE ON ${q}.jobs
      REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
      FOR EACH STATEMENT EXECUTE FUNCTION ${q}.log_transitions()`);

    const committed: string[] = [];
    const rolledBack: string[] = [];
    let n = 0;
    const batch = (size: number, isCommitted: boolean): Payload[] => Array.from({ length: size }, () => ({ n: n++, committed: isCommitted }));

    /** Enqueues in a transaction of mailroom's that commits, optionally held open a while. */
    async function commitBatch(size: number, holdMs = 0): Promise<void> {
      const ids = await mailroom.transaction(async (tx) => {
        const ids = await mailroom.enqueueMany(def, batch(size, true), { tx });
        if (holdMs) await sleep(holdMs);
        return ids;
      });
      committed.push(...ids);
    }
    /** Enqueues in a transaction that rolls back (mailroom's, or the caller's own pg client), held open a while. */
    async function rollbackBatch(size: number, holdMs: number, via: 'mailroom' | 'client'): Promise<void> {
      if (via === 'mailroom') {
        await assert.rejects(
          mailroom.transaction(async (tx) => {
            rolledBack.push(...(await mailroom.enqueueMany(def, batch(size, false), { tx })));
            await sleep(holdMs);
            throw new Rollback('roll back');
          }),
          Rollback,
        );
        return;
      }
      const client = await admin.connect();
      try {
        await client.query('BEGIN');
        for (const data of batch(size, false)) rolledBack.push(await mailroom.enqueue(def, data, { tx: client }));
        await sleep(holdMs);
        await client.query('ROLLBACK');
      } finally {
        client.release();
      }
    }

    // Phase 1, before any worker runs: 1,000 committed (plain and in
    // transactions) and 150 rolled back.
    for (let i = 0; i < 3; i++) committed.push(...(await mailroom.enqueueMany(def, batch(200, true))));
    for (let i = 0; i < 8; i++) await commitBatch(50);
    for (let i = 0; i < 3; i++) await rollbackBatch(50, 0, i % 2 ? 'client' : 'mailroom');

    const config: CrashWorkerConfig = {
      url: url!,
      schema,
      queue: QUEUE,
      type: TYPE,
      mode: 'record',
      concurrency: 4,
      lease: '2s',
      rescueInterval: '500ms',
      pollInterval: '200ms',
      handlerMs: [30, 150],
    };
    const spawned: ChildWorker[] = [];
    const start = () => {
      const child = spawnWorker(config);
      spawned.push(child);
      return child;
    };
    for (let i = 0; i < WORKERS; i++) start();
    await Promise.all(spawned.map((c) => c.ready));

    // Phase 2, while workers run and get killed: 1,000 more committed and 200
    // more rolled back, in transactions held open while workers poll.
    const enqueuing = (async () => {
      for (let i = 0; i < 20; i++) {
        await commitBatch(40, randomInt(0, 60));
        for (let j = 0; j < 10; j++) committed.push(await mailroom.enqueue(def, { n: n++, committed: true }));
        await rollbackBatch(10, randomInt(0, 60), i % 2 ? 'client' : 'mailroom');
        await sleep(randomInt(50, 250));
      }
    })();
    let enqueueDone = false;
    let enqueueError: unknown;
    void enqueuing.then(
      () => (enqueueDone = true),
      (error: unknown) => {
        enqueueError = error;
        enqueueDone = true;
      },
    );

    const remaining = async () =>
      Number((await sql<{ n: string }>(`SELECT count(*) AS n FROM ${q}.jobs WHERE state <> 'completed'`))[0]!.n);

    // Kill a random running worker at a random moment, start a replacement, repeat.
    const killedPids = new Set<number>();
    let kills = 0;
    while (kills < MAX_KILLS && (!enqueueDone || (await remaining()) > 0)) {
      assert.ok(Date.now() - t0 < DEADLINE_MS, `not done after ${DEADLINE_MS} ms (${kills} kills so far)`);
      await sleep(randomInt(200, 800));
      // Kill only while another worker keeps running: on a loaded machine a replacement takes seconds to boot,
      // and kills faster than that left no worker running at all.
      const running = spawned.filter((c) => children.has(c) && Number.isFinite(c.readyAt));
      if (running.length < 2) continue;
      const candidates = running.filter((c) => Date.now() - c.readyAt >= MIN_UPTIME_MS);
      const victim = candidates[randomInt(0, candidates.length - 1)];
      if (!victim) continue;
      killedPids.add(victim.pid);
      await killChildWorker(victim);
      kills++;
      start();
    }
    if (enqueueError) throw enqueueError;
    await enqueuing;
    const killPhaseMs = Date.now() - t0;
    const remainingAfterKills = await remaining();

    // Let the survivors (and replacements) finish everything.
    await eventually(async () => (await remaining()) === 0, Math.max(5_000, DEADLINE_MS - (Date.now() - t0)), 'every job to complete');
    const drainedMs = Date.now() - t0;
    // Stop every worker before reading the history, so nothing changes under the checker
    // (and a late stale run would be recorded before we look).
    await Promise.all([...children].map((c) => killChildWorker(c)));
    for (const child of spawned) {
      const errors = child.lines.filter((l) => l.event === 'error' || l.event === 'failed');
      if (errors.length > 0) console.log(`worker ${child.pid} reported:`, JSON.stringify(errors.slice(0, 5)));
    }

    // ---- Checker: the complete history ----
    const jobs = await sql<{ id: string; state: string; attempt: number; claim_count: number; committed: boolean }>(
      `SELECT id, state, attempt, claim_count, (payload->>'committed')::boolean AS committed FROM ${q}.jobs`,
    );
    const runs = await sql<{ job_id: string; worker_pid: number; attempt: number }>(`SELECT job_id, worker_pid, attempt FROM ${q}.runs`);
    const effects = await sql<{ job_id: string; attempt: number }>(`SELECT job_id, attempt FROM ${q}.effects`);
    const errors = await sql<{ job_id: string; claim: number; attempt: number; category: string; message: string }>(
      `SELECT job_id, claim, attempt, category, message FROM ${q}.job_errors ORDER BY job_id, claim`,
    );
    const transitions = await sql<{ job_id: string; old_state: string; new_state: string; old_claim: number; new_claim: number }>(
      `SELECT job_id, old_state, new_state, old_claim, new_claim FROM ${q}.transitions ORDER BY seq`,
    );

    const committedSet = new Set(committed);
    const rolledBackSet = new Set(rolledBack);
    const jobById = new Map(jobs.map((j) => [j.id, j]));
    const sample = <T>(list: T[]) => JSON.stringify(list.slice(0, 5));

    // Guarantee 1: nothing committed is lost; every committed job completed.
    const lost = committed.filter((id) => jobById.get(id)?.state !== 'completed');
    assert.deepEqual(lost.length, 0, `lost (missing or not completed) jobs: ${lost.length}, e.g. ${sample(lost.map((id) => ({ id, row: jobById.get(id) })))}`);

    // Guarantee 2: nothing rolled back exists or ran; nothing unexpected exists.
    assert.equal(rolledBackSet.size, 350, 'the test rolled back 350 enqueues');
    const unexpected = jobs.filter((j) => !committedSet.has(j.id) || rolledBackSet.has(j.id) || !j.committed);
    assert.equal(unexpected.length, 0, `jobs that should not exist: ${sample(unexpected)}`);
    const unexpectedRuns = runs.filter((r) => !committedSet.has(r.job_id) || rolledBackSet.has(r.job_id));
    assert.equal(unexpectedRuns.length, 0, `runs of jobs that were never committed: ${sample(unexpectedRuns)}`);

    // Guarantee 3: an effect written through ctx.tx took effect exactly once per
    // job, by the claim that completed it, however often the job was delivered.
    const effectsByJob = new Map<string, number[]>();
    for (const e of effects) effectsByJob.set(e.job_id, [...(effectsByJob.get(e.job_id) ?? []), e.attempt]);
    const wrongEffects = jobs
      .map((j) => ({ id: j.id, attempt: j.attempt, effects: effectsByJob.get(j.id) ?? [] }))
      .filter((j) => j.effects.length !== 1 || j.effects[0] !== j.attempt);
    const strayEffects = effects.filter((e) => !jobById.has(e.job_id));
    assert.equal(wrongEffects.length, 0, `jobs without exactly one effect from their completing claim: ${sample(wrongEffects)}`);
    assert.equal(strayEffects.length, 0, `effects of jobs that do not exist: ${sample(strayEffects)}`);

    // No claim ever ran twice, and no run belongs to a claim the job never had.
    const runKeys = new Set<string>();
    const doubleRuns = runs.filter((r) => {
      const key = `${r.job_id}/${r.attempt}`;
      if (runKeys.has(key)) return true;
      runKeys.add(key);
      return false;
    });
    assert.equal(doubleRuns.length, 0, `one claim delivered twice: ${sample(doubleRuns)}`);
    const phantomRuns = runs.filter((r) => r.attempt > (jobById.get(r.job_id)?.attempt ?? 0));
    assert.equal(phantomRuns.length, 0, `runs with an attempt the job never reached: ${sample(phantomRuns)}`);

    // The claim that completed each job ran its handler before the completion
    // (timestamps both from the database's clock).
    const unexplained = await sql(
      `SELECT j.id, j.attempt FROM ${q}.jobs AS j
        WHERE NOT EXISTS (SELECT 1 FROM ${q}.runs AS r WHERE r.job_id = j.id AND r.attempt = j.attempt AND r.started_at <= j.finished_at)`,
    );
    assert.equal(unexplained.length, 0, `jobs completed without a run of their last claim before finished_at: ${sample(unexplained)}`);

    // No job ran after it was completed: no run of the completing claim (or a
    // later one) started after finished_at. A run of an *older*, expired claim
    // that starts late would be a stale duplicate delivery (allowed by
    // at-least-once; its result is fenced off): it is counted, not failed.
    const lateRuns = await sql<{ job_id: string; attempt: number; final_attempt: number }>(
      `SELECT r.job_id, r.attempt, j.attempt AS final_attempt FROM ${q}.runs AS r JOIN ${q}.jobs AS j ON j.id = r.job_id
        WHERE r.started_at > j.finished_at`,
    );
    const ranAfterCompletion = lateRuns.filter((r) => r.attempt >= r.final_attempt);
    assert.equal(ranAfterCompletion.length, 0, `runs that started after their job completed: ${sample(ranAfterCompletion)}`);

    // Every extra attempt is explained by one error row for its claim: a
    // lease-expired rescue (a killed worker), or else a failure of the handler,
    // which only fails when the database refuses it (e.g. too many connections on
    // a shared server); those are reported below.
    const errorsByJob = new Map<string, typeof errors>();
    for (const e of errors) errorsByJob.set(e.job_id, [...(errorsByJob.get(e.job_id) ?? []), e]);
    const badErrors: unknown[] = [];
    for (const j of jobs) {
      const list = errorsByJob.get(j.id) ?? [];
      const ok = j.claim_count === j.attempt && list.length === j.attempt - 1 && list.every((e, i) => e.claim === i + 1 && e.attempt === i + 1);
      if (!ok) badErrors.push({ job: j, errors: list });
    }
    assert.equal(badErrors.length, 0, `jobs whose extra attempts are not one error row per earlier claim: ${sample(badErrors)}`);
    const handlerFailures = errors.filter((e) => e.category !== 'lease-expired');
    if (handlerFailures.length > 0) console.log('handler failures (retried):', JSON.stringify(handlerFailures.slice(0, 5)));

    // The state-change log: claims, rescues and one completion, in a legal
    // order, and nothing at all after the completion.
    const transitionsByJob = new Map<string, typeof transitions>();
    for (const t of transitions) transitionsByJob.set(t.job_id, [...(transitionsByJob.get(t.job_id) ?? []), t]);
    const badHistories: unknown[] = [];
    for (const j of jobs) {
      const list = transitionsByJob.get(j.id) ?? [];
      let claim = 0;
      let state = 'available';
      let ok = true;
      for (const t of list) {
        const legal =
          t.old_state === state &&
          t.old_claim === claim &&
          ((t.new_state === 'active' && (state === 'available' || state === 'retrying') && t.new_claim === claim + 1) ||
            (state === 'active' && (t.new_state === 'retrying' || t.new_state === 'completed') && t.new_claim === claim));
        if (!legal) ok = false;
        state = t.new_state;
        claim = t.new_claim;
      }
      if (!ok || state !== 'completed' || claim !== j.claim_count) badHistories.push({ job: j, transitions: list });
    }
    assert.equal(badHistories.length, 0, `jobs with an illegal history (e.g. claimed after completion): ${sample(badHistories)}`);

    // Not vacuous: workers were killed, mid-job, and their jobs were rescued.
    const rescued = errors.filter((e) => e.category === 'lease-expired');
    const rescuedKeys = new Set(rescued.map((e) => `${e.job_id}/${e.claim}`));
    const runsOfRescuedClaims = runs.filter((r) => rescuedKeys.has(`${r.job_id}/${r.attempt}`));
    const killedMidJob = runsOfRescuedClaims.filter((r) => killedPids.has(r.worker_pid));
    const rescuedFromLiveWorkers = runsOfRescuedClaims.filter((r) => !killedPids.has(r.worker_pid));
    assert.ok(kills >= MIN_KILLS, `only ${kills} kills happened; the test needs at least ${MIN_KILLS}`);
    assert.ok(rescued.length > 0, 'no job was rescued: no kill landed mid-job');
    assert.ok(killedMidJob.length > 0, 'no rescued claim had started its handler in a killed worker');

    const distinctRan = new Set(runs.map((r) => r.job_id)).size;
    console.log(
      JSON.stringify({
        crash: 'SIGKILL',
        jobs: committed.length,
        rolledBack: rolledBack.length,
        workersStarted: spawned.length,
        kills,
        rescuedClaims: rescued.length,
        handlerFailures: handlerFailures.length,
        jobsWithMoreThanOneAttempt: jobs.filter((j) => j.attempt > 1).length,
        maxAttempt: Math.max(...jobs.map((j) => j.attempt)),
        handlerRuns: runs.length,
        duplicateDeliveries: runs.length - distinctRan,
        effects: effects.length,
        duplicatedEffects: effects.length - new Set(effects.map((e) => e.job_id)).size,
        rescuedClaimsKilledMidHandler: killedMidJob.length,
        rescuedClaimsOfLiveWorkers: rescuedFromLiveWorkers.length,
        lateStaleRuns: lateRuns.length,
        lost: lost.length,
        killPhaseMs,
        remainingAfterKills,
        drainedMs,
        totalMs: Date.now() - t0,
      }),
    );
  });

  /**
   * One child worker (lease 1s) claims the job and is paused with SIGSTOP in
   * its handler; a worker in this process rescues and claims it again. Then the
   * child is resumed after its handler's own time has passed, so on waking it
   * goes straight to recording its (stale) result.
   */
  async function pausedPastLease(
    mode: 'slow-complete' | 'slow-throw' | 'slow-tx-complete',
    secondHandler: (release: Promise<void>, ctx: JobContext, job: Job) => Promise<void>,
  ) {
    const { schema, q, mailroom } = await openSchema('crash_stop');
    const TYPE = 'crash.fence';
    const QUEUE = 'fence';
    const HANDLER_MS = 1200;
    const def = defineJob<{ n: number }>(TYPE, { queue: QUEUE });
    await sql(`CREATE TABLE ${q}.effects (job_id uuid NOT NULL, worker_pid integer NOT NULL, attempt integer NOT NULL)`);
    const id = await mailroom.enqueue(def, { n: 1 });

    const child = spawnWorker({
      url: url!,
      schema,
      queue: QUEUE,
      type: TYPE,
      mode,
      concurrency: 1,
      lease: '1s',
      rescueInterval: '100ms',
      pollInterval: '100ms',
      handlerMs: [HANDLER_MS, HANDLER_MS],
    });
    const childWorkerId = await child.ready;
    await child.waitFor((l) => l.event === 'started' && l.id === id, 20_000, `the start of job ${id}`);
    const startedAt = Date.now();
    child.proc.kill('SIGSTOP');
    const [claimed] = await sql<{ state: string; claim_count: number; locked_by: string }>(`SELECT state, claim_count, locked_by FROM ${q}.jobs WHERE id = $1`, [id]);
    assert.deepEqual(claimed, { state: 'active', claim_count: 1, locked_by: childWorkerId });

    // The newer claim: a worker in this process (its mailroom rescues every 100ms).
    let releaseSecond!: () => void;
    const release = new Promise<void>((resolve) => (releaseSecond = resolve));
    const secondRuns: number[] = [];
    const second: Worker = mailroom.worker({
      queues: [QUEUE],
      concurrency: 1,
      lease: '10s',
      pollInterval: '50ms',
      handlers: {
        [TYPE]: async (job, ctx) => {
          secondRuns.push(job.attempt);
          await secondHandler(release, ctx, job);
        },
      },
    });
    await second.start();
    return { q, id, child, childWorkerId, second, secondRuns, startedAt, HANDLER_MS, releaseSecond };
  }

  const readJob = async (q: string, id: string) =>
    (
      await sql<{ state: string; attempt: number; claim_count: number; locked_by: string; finished_at: string | null; dead_reason: string | null; category: string }>(
        `SELECT state, attempt, claim_count, locked_by, finished_at::text, dead_reason, last_error->>'category' AS category FROM ${q}.jobs WHERE id = $1`,
        [id],
      )
    )[0]!;
  const readErrors = (q: string, id: string) =>
    sql<{ claim: number; category: string }>(`SELECT claim, category FROM ${q}.job_errors WHERE job_id = $1 ORDER BY claim`, [id]);

  it('SIGSTOP past the lease: the stale worker cannot complete a job the newer claim completed', { timeout: 60_000 }, async () => {
    const t0 = Date.now();
    const { q, id, child, second, secondRuns, startedAt, HANDLER_MS } = await pausedPastLease('slow-complete', async () => {});

    await eventually(async () => (await readJob(q, id)).state === 'completed', 20_000, 'the newer claim to complete the job');
    const snapshot = await readJob(q, id);
    assert.deepEqual({ ...snapshot, finished_at: null }, {
      state: 'completed', attempt: 2, claim_count: 2, locked_by: second.id, finished_at: null, dead_reason: null, category: 'lease-expired',
    });
    assert.deepEqual(secondRuns, [2]);

    // Resume the paused worker once its handler's time is up, so it records a result at once.
    await eventually(() => Date.now() - startedAt > HANDLER_MS + 100, 5_000, 'the paused handler to be due');
    const pausedMs = Date.now() - startedAt;
    child.proc.kill('SIGCONT');
    await child.waitFor((l) => l.event === 'stale' && l.id === id, 15_000, `a stale event for job ${id}`);

    const events = child.lines.filter((l) => 'id' in l && l.id === id).map((l) => l.event);
    assert.ok(events.includes('handler-returned'), `the stale handler should have finished: ${events.join(', ')}`);
    assert.ok(!events.includes('completed') && !events.includes('failed'), `the stale worker recorded a result: ${events.join(', ')}`);
    assert.deepEqual(await readJob(q, id), snapshot, 'the job row changed after the stale worker resumed');
    assert.deepEqual(await readErrors(q, id), [{ claim: 1, category: 'lease-expired' }]);
    console.log(JSON.stringify({ crash: 'SIGSTOP', variant: 'stale complete', pausedMs, childEvents: events, totalMs: Date.now() - t0 }));
    await killChildWorker(child);
  });

  it('SIGSTOP past the lease: the stale worker cannot fail a job the newer claim holds', { timeout: 60_000 }, async () => {
    const t0 = Date.now();
    let secondStarted = false;
    const { q, id, child, second, secondRuns, startedAt, HANDLER_MS, releaseSecond } = await pausedPastLease('slow-throw', async (release) => {
      secondStarted = true;
      await release;
    });

    await eventually(() => secondStarted, 20_000, 'the newer claim to start the job');
    const snapshot = await readJob(q, id);
    assert.deepEqual(snapshot, {
      state: 'active', attempt: 2, claim_count: 2, locked_by: second.id, finished_at: null, dead_reason: null, category: 'lease-expired',
    });

    await eventually(() => Date.now() - startedAt > HANDLER_MS + 100, 5_000, 'the paused handler to be due');
    const pausedMs = Date.now() - startedAt;
    child.proc.kill('SIGCONT');
    // The resumed handler throws a PermanentError: unfenced, it would dead-letter the job.
    await child.waitFor((l) => l.event === 'stale' && l.id === id, 15_000, `a stale event for job ${id}`);
    const events = child.lines.filter((l) => 'id' in l && l.id === id).map((l) => l.event);
    assert.ok(events.includes('handler-threw'), `the stale handler should have thrown: ${events.join(', ')}`);
    assert.ok(!events.includes('failed') && !events.includes('completed'), `the stale worker recorded a result: ${events.join(', ')}`);
    assert.deepEqual(await readJob(q, id), snapshot, 'the stale failure changed the job');
    assert.deepEqual(await readErrors(q, id), [{ claim: 1, category: 'lease-expired' }]);

    // The newer claim is unaffected and completes normally.
    releaseSecond();
    await eventually(async () => (await readJob(q, id)).state === 'completed', 10_000, 'the newer claim to complete the job');
    const completed = await readJob(q, id);
    assert.deepEqual({ ...completed, finished_at: null }, { ...snapshot, state: 'completed' });
    assert.deepEqual(await readErrors(q, id), [{ claim: 1, category: 'lease-expired' }]);
    assert.deepEqual(secondRuns, [2]);
    console.log(JSON.stringify({ crash: 'SIGSTOP', variant: 'stale fail', pausedMs, childEvents: events, totalMs: Date.now() - t0 }));
    await killChildWorker(child);
  });

  it('SIGSTOP past the lease: what the stale handler wrote through ctx.tx never commits', { timeout: 60_000 }, async () => {
    const t0 = Date.now();
    const { q, id, child, second, secondRuns, startedAt, HANDLER_MS } = await pausedPastLease('slow-tx-complete', async (_release, ctx, job) => {
      await ctx.tx.query(`INSERT INTO ${q}.effects (job_id, worker_pid, attempt) VALUES ($1, $2, $3)`, [job.id, process.pid, job.attempt]);
    });

    await eventually(async () => (await readJob(q, id)).state === 'completed', 20_000, 'the newer claim to complete the job');
    const snapshot = await readJob(q, id);
    assert.equal(snapshot.locked_by, second.id);
    assert.equal(snapshot.claim_count, 2);

    await eventually(() => Date.now() - startedAt > HANDLER_MS + 100, 5_000, 'the paused handler to be due');
    const pausedMs = Date.now() - startedAt;
    child.proc.kill('SIGCONT');
    // The stale worker either finds its completion fenced off ('stale') or its
    // transaction already ended by the server while it was paused ('error'):
    // either way nothing it wrote commits.
    const returned = await child.waitFor((l) => l.event === 'handler-returned' && l.id === id, 15_000, 'the stale handler to return');
    const returnedAt = child.lines.indexOf(returned);
    await child.waitFor(
      (l) => child.lines.indexOf(l) > returnedAt && ((l.event === 'stale' && l.id === id) || l.event === 'error'),
      15_000,
      `a stale event or an error for job ${id}`,
    );
    const events = child.lines.filter((l) => !('id' in l) || l.id === id).map((l) => l.event);
    assert.ok(!events.includes('completed') && !events.includes('failed'), `the stale worker recorded a result: ${events.join(', ')}`);
    assert.deepEqual(await readJob(q, id), snapshot, 'the job row changed after the stale worker resumed');
    assert.deepEqual(await sql(`SELECT worker_pid, attempt FROM ${q}.effects WHERE job_id = $1`, [id]), [{ worker_pid: process.pid, attempt: 2 }]);
    assert.deepEqual(secondRuns, [2]);
    console.log(JSON.stringify({ crash: 'SIGSTOP', variant: 'stale ctx.tx', pausedMs, childEvents: events, totalMs: Date.now() - t0 }));
    await killChildWorker(child);
  });
});
