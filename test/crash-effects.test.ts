/**
 * Exactly-once effects (guarantee 3) and per-key ordering (guarantee 4) with
 * real worker processes that are killed (SIGKILL) and paused (SIGSTOP).
 *
 * Workers run as child processes (test/fixtures/effects-worker.ts) against a
 * real PostgreSQL server (PGlite serves one process only), so the suite needs
 * TEST_DATABASE_URL and is skipped without it.
 *
 * What is trusted: rows written through `ctx.tx` (account balances, `effects`)
 * commit only with the job's fenced completion, so they are the record of what
 * *took effect*. Rows the handler writes on its own autocommit connection
 * (`runs`: start, and in the ordering test end and outcome) are the record of
 * what *ran*, including runs that were killed, failed or fenced off. All
 * timestamps come from the database clock.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { createMailroom, defineJob, type Mailroom, type RetryOptions } from '../src/index.ts';
import { uniqueSchema } from './helpers/databases.ts';
import { fixtureBundle } from './helpers/fixture-bundle.ts';
import { eventually } from './helpers/events.ts';
import { killChildWorker, spawnChildWorker, type ChildWorker } from './helpers/child-worker.ts';
import type { CreditPayload, EffectsWorkerConfig, EffectsWorkerLine, StepPayload } from './fixtures/effects-worker.ts';

const url = process.env.TEST_DATABASE_URL;
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const FIXTURE = fileURLToPath(new URL('./fixtures/effects-worker.ts', import.meta.url));
/** The fixture bundled once: replacements boot in about a third of the CPU (see helpers/fixture-bundle.ts). */
const FIXTURE_JS = await fixtureBundle(FIXTURE);

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
const randomInt = (min: number, max: number) => min + Math.floor(Math.random() * (max - min + 1));
const sample = <T>(list: T[]) => JSON.stringify(list.slice(0, 5));

// Job definitions of this process (the children define the same names with the same policy).
const CREDIT_RETRY: RetryOptions = { maxAttempts: 25, backoff: { base: 10, max: 100 } };
const STEP_RETRY: RetryOptions = { maxAttempts: 10, backoff: { base: 10, max: 50 } };
const credit = defineJob<CreditPayload>('fx.credit', { queue: 'fx', retry: CREDIT_RETRY });
const step = defineJob<StepPayload>('ord.step', { queue: 'ord', retry: STEP_RETRY });
const tput = defineJob<StepPayload & { run: string }>('tput.step', { queue: 'tput', retry: STEP_RETRY });

// ---------------------------------------------------------------------------
// Child worker processes
// ---------------------------------------------------------------------------

type Child = ChildWorker<EffectsWorkerLine> & {
  /** `application_name` of its sessions. */
  app: string;
  stopped: boolean;
};

const children = new Set<Child>();
/** Children that exited without being killed by the test (a worker crashed on its own). */
const unexpectedExits: { pid: number; code: number | null; signal: string | null; stderr: string }[] = [];

function spawnChild(config: EffectsWorkerConfig): Child {
  const child = spawnChildWorker<EffectsWorkerLine>(FIXTURE_JS, config, {
    cwd: ROOT,
    registry: children,
    onExit: (exited, code, signal) => {
      if (!exited.killedByTest) unexpectedExits.push({ pid: exited.pid, code, signal, stderr: exited.stderr() });
    },
  });
  return Object.assign(child, { app: `${config.appPrefix}-${child.pid}`, stopped: false });
}

const isLive = (c: Child) => c.proc.exitCode === null && c.proc.signalCode === null && !c.killedByTest;

// ---------------------------------------------------------------------------

describe(
  'exactly-once effects and per-key ordering with worker processes killed and paused (PostgreSQL)',
  { skip: url ? false : 'TEST_DATABASE_URL is not set: these tests run worker processes against a PostgreSQL server (PGlite serves one process only)' },
  () => {
    let admin: pg.Pool;
    const schemas = new Set<string>();
    const mailrooms = new Set<Mailroom>();

    const sql = async <R extends object = Record<string, unknown>>(text: string, params: unknown[] = []): Promise<R[]> =>
      (await admin.query(text, params)).rows as R[];
    const dbNow = async () => (await sql<{ us: string }>(`SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us`))[0]!.us;

    async function openSchema(prefix: string): Promise<{ schema: string; q: string; mailroom: Mailroom }> {
      const schema = uniqueSchema(prefix);
      schemas.add(schema);
      // dedupKeys: a duplicate enqueue that arrives after its job completed still gets that job's id.
      const mailroom = await createMailroom({ database: url!, schema, poolSize: 4, retention: { dedupKeys: '1h' } });
      mailrooms.add(mailroom);
      await mailroom.migrate();
      return { schema, q: `"${schema}"`, mailroom };
    }

    async function closeSchema(schema: string, mailroom: Mailroom): Promise<void> {
      await Promise.all([...children].map((c) => killChildWorker(c)));
      await mailroom.close({ timeout: 1000 }).catch(() => {});
      mailrooms.delete(mailroom);
      await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      schemas.delete(schema);
    }

    before(() => {
      admin = new pg.Pool({ connectionString: url!, max: 3 });
    });

    after(async () => {
      await Promise.all([...children].map((c) => killChildWorker(c)));
      for (const m of mailrooms) await m.close({ timeout: 1000 }).catch(() => {});
      for (const schema of schemas) await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => {});
      await admin.end();
    });

    it(
      'ctx.tx credits: balances equal the number of distinct jobs exactly, under SIGKILL, SIGSTOP past the lease, duplicate enqueues and failures after the write',
      { timeout: 150_000 },
      async () => {
        const t0 = Date.now();
        const { schema, q, mailroom } = await openSchema('fx');
        const ACCOUNTS = 20;
        const JOBS = 1500;
        const WORKERS = 4;
        const LEASE_MS = 1500;
        const MIN_KILLS = 5;
        const MAX_KILLS = 20;
        /** A worker is killed only after it ran this long (it has claimed work; a booting replacement is left alone). */
        const MIN_UPTIME_MS = 600;
        const DEADLINE_MS = 90_000;
        const APP = `fx${process.pid}`;
        try {
          await sql(`CREATE TABLE ${q}.accounts (id int PRIMARY KEY, balance int NOT NULL DEFAULT 0)`);
          await sql(`INSERT INTO ${q}.accounts (id) SELECT generate_series(0, ${ACCOUNTS - 1})`);
          await sql(`CREATE TABLE ${q}.runs (job_id uuid NOT NULL, n int NOT NULL, attempt int NOT NULL, pid int NOT NULL,
            started_at timestamptz NOT NULL DEFAULT clock_timestamp())`);
          await sql(`CREATE TABLE ${q}.effects (job_id uuid NOT NULL, n int NOT NULL, attempt int NOT NULL, pid int NOT NULL,
            at timestamptz NOT NULL DEFAULT clock_timestamp())`);

          // 1,500 distinct jobs (dedup key credit:<n>), 75 per account; one in ten (spread over every account)
          // throws after its credit on its first attempt.
          const payloads: CreditPayload[] = Array.from({ length: JOBS }, (_, n) => ({ n, account: n % ACCOUNTS, failFirst: Math.floor(n / ACCOUNTS) % 10 === 3 }));
          const keyOf = (d: CreditPayload) => `credit:${d.n}`;
          const idByN: string[] = [];
          for (let i = 0; i < JOBS; i += 500) idByN.push(...(await mailroom.enqueueMany(credit, payloads.slice(i, i + 500), { key: keyOf })));
          assert.equal(new Set(idByN).size, JOBS);

          const config: EffectsWorkerConfig = {
            url: url!,
            schema,
            mode: 'credit',
            concurrency: 3,
            lease: LEASE_MS,
            rescueInterval: '250ms',
            pollInterval: '100ms',
            sleepMs: [20, 60],
            retry: CREDIT_RETRY,
            appPrefix: APP,
          };
          const spawned: Child[] = [];
          const start = () => {
            const child = spawnChild(config);
            spawned.push(child);
            return child;
          };
          for (let i = 0; i < WORKERS; i++) start();
          await Promise.all(spawned.map((c) => c.ready));

          const counts = async () =>
            (
              await sql<{ completed: number; unfinished: number; total: number }>(
                `SELECT count(*) FILTER (WHERE state = 'completed')::int AS completed, count(*) FILTER (WHERE state <> 'completed')::int AS unfinished,
                        count(*)::int AS total FROM ${q}.jobs`,
              )
            )[0]!;

          // What the test saw every half second, for failure messages: jobs by state, live and ready workers, kills.
          let kills = 0;
          const timeline: string[] = [];
          let sampling = true;
          const sampler = (async () => {
            while (sampling && children.size > 0) {
              const c = await counts().catch(() => undefined);
              const live = [...children].filter(isLive);
              timeline.push(`${Date.now() - t0}ms done=${c?.completed} live=${live.length} ready=${live.filter((w) => w.workerId).length} stopped=${live.filter((w) => w.stopped).length} kills=${kills}`);
              await sleep(500);
            }
          })();
          // Duplicate enqueues while the workers run: every key again, in shuffled batches, one at a time and in
          // transactions, so some meet an unfinished job and some a completed one. Each must get the first job's id.
          const duplicates = (async () => {
            const order = payloads.map((d) => d.n).sort(() => Math.random() - 0.5);
            let mismatched = 0;
            let i = 0;
            let round = 0;
            while (i < order.length) {
              const size = randomInt(20, 80);
              const batch = order.slice(i, i + size).map((n) => payloads[n]!);
              i += size;
              let ids: string[];
              if (round % 3 === 0) ids = await mailroom.enqueueMany(credit, batch, { key: keyOf });
              else if (round % 3 === 1) ids = await mailroom.transaction((tx) => mailroom.enqueueMany(credit, batch, { key: keyOf, tx }));
              else ids = await Promise.all(batch.map((d) => mailroom.enqueue(credit, d, { key: keyOf(d) })));
              round++;
              batch.forEach((d, k) => {
                if (ids[k] !== idByN[d.n]) mismatched++;
              });
              await sleep(randomInt(50, 200));
            }
            return mismatched;
          })();
          let duplicatesDone = false;
          void duplicates.then(
            () => (duplicatesDone = true),
            () => (duplicatesDone = true),
          );

          // SIGSTOP one worker while it has a ctx.tx transaction open (idle in transaction, holding an
          // account's row lock), for longer than its lease. The server must end those sessions
          // (idle_in_transaction_session_timeout = lease) while it is still stopped; the other workers must
          // keep completing jobs of the accounts it was crediting; its claims must be rescued.
          const stopReport: Record<string, unknown> = {};
          let stopDone = false;
          const stopping = (async () => {
            await eventually(async () => (await counts()).completed >= JOBS * 0.1, DEADLINE_MS, '10% of the jobs to complete before the SIGSTOP');
            const openTx = (app: string) =>
              sql<{ pid: number; state: string }>(`SELECT pid, state FROM pg_stat_activity WHERE application_name = $1 AND xact_start IS NOT NULL`, [app]);
            let victim: Child | undefined;
            let stoppedAt = 0;
            let stopUs = '';
            let atStop: { pid: number; state: string }[] = [];
            for (let tries = 0; tries < 20 && !victim; tries++) {
              const candidate = [...children].find((c) => isLive(c) && c.workerId && Date.now() - c.readyAt >= MIN_UPTIME_MS);
              if (!candidate) {
                await sleep(100);
                continue;
              }
              // Stop it at a moment when it has a transaction idle (a handler sleeping after its credit).
              try {
                await eventually(async () => (await openTx(candidate.app)).some((s) => s.state === 'idle in transaction'), 3000, 'an idle transaction');
              } catch {
                continue;
              }
              if (!isLive(candidate)) continue;
              candidate.stopped = true;
              candidate.proc.kill('SIGSTOP');
              stoppedAt = Date.now();
              stopUs = await dbNow();
              atStop = await openTx(candidate.app);
              if (atStop.some((s) => s.state === 'idle in transaction')) victim = candidate;
              else {
                candidate.proc.kill('SIGCONT'); // its transaction finished in between: try again
                candidate.stopped = false;
              }
            }
            assert.ok(victim, `could not SIGSTOP a worker while it had a transaction open; timeline: ${timeline.slice(-40).join(' | ')}`);
            const claims = await sql<{ id: string; claim: number; account: number }>(
              `SELECT id, claim_count AS claim, (payload->>'account')::int AS account FROM ${q}.jobs WHERE state = 'active' AND locked_by = $1`,
              [victim.workerId],
            );
            const accounts = [...new Set(claims.map((c) => c.account))];
            const backendPids = atStop.map((s) => s.pid);
            let blockedPeak = 0;
            let sessionsEndedMs = -1;
            /** What the wait below saw last, for its failure message. */
            const lastSeen: Record<string, unknown> = {};
            // While it is stopped: its open transactions end (the server times them out), sessions that waited
            // for its row locks get them, its claims are rescued (lease expired), and the accounts it was
            // crediting get credited by other workers.
            await eventually(
              async () => {
                const [blocked] = await sql<{ n: number }>(
                  `SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pg_blocking_pids(pid) && $1::int[]`,
                  [backendPids],
                );
                blockedPeak = Math.max(blockedPeak, blocked!.n);
                if (sessionsEndedMs < 0) {
                  const open = await sql<{ pid: number; state: string; wait: string | null; query: string }>(
                    `SELECT pid, state, wait_event_type || ':' || wait_event AS wait, left(query, 80) AS query
                       FROM pg_stat_activity WHERE application_name = $1 AND xact_start IS NOT NULL`,
                    [victim.app],
                  );
                  lastSeen.victimOpenTransactions = open;
                  if (open.length === 0) sessionsEndedMs = Date.now() - stoppedAt;
                }
                if (sessionsEndedMs < 0 || Date.now() - stoppedAt < LEASE_MS + 1000) return false;
                const [progress] = await sql<{ accounts: number; held: number }>(
                  `SELECT (SELECT count(DISTINCT (payload->>'account')::int)::int FROM ${q}.jobs
                            WHERE state = 'completed' AND finished_at > to_timestamp($1::bigint / 1000000.0)
                              AND (payload->>'account')::int = ANY($2::int[])) AS accounts,
                          (SELECT count(*)::int FROM ${q}.jobs WHERE state = 'active' AND locked_by = $3) AS held`,
                  [stopUs, accounts, victim.workerId],
                );
                Object.assign(lastSeen, { accountsCredited: progress!.accounts, accountsToCredit: accounts, claimsStillHeld: progress!.held });
                return progress!.accounts === accounts.length && progress!.held === 0;
              },
              LEASE_MS * 2 + 15_000,
              "the paused worker's transactions to be ended by the server, its claims rescued and its accounts credited by others",
            ).catch(async (error: Error) => {
              const jobs = await sql(
                `SELECT id, state, attempt, claim_count, locked_by, run_at, (payload->>'account')::int AS account FROM ${q}.jobs
                  WHERE (payload->>'account')::int = ANY($1::int[]) AND state <> 'completed' ORDER BY run_at LIMIT 20`,
                [accounts],
              ).catch((e: Error) => e.message);
              throw new Error(`${error.message}; last seen: ${JSON.stringify({ ...lastSeen, sessionsEndedMs, claims, unfinishedOfThoseAccounts: jobs })}; timeline: ${timeline.slice(-40).join(' | ')}`);
            });
            const completedWhileStopped = (
              await sql<{ n: number }>(`SELECT count(*)::int AS n FROM ${q}.jobs WHERE state = 'completed' AND finished_at > to_timestamp($1::bigint / 1000000.0)`, [stopUs])
            )[0]!.n;
            const [rescuedAtStop] = await sql<{ n: number }>(
              `SELECT count(*)::int AS n FROM ${q}.job_errors AS e JOIN unnest($1::uuid[], $2::int[]) AS c(id, claim) ON e.job_id = c.id AND e.claim = c.claim
                WHERE e.category = 'lease-expired'`,
              [claims.map((c) => c.id), claims.map((c) => c.claim)],
            );
            const stoppedMs = Date.now() - stoppedAt;
            const contUs = await dbNow();
            victim.proc.kill('SIGCONT');
            // Resumed, with its handler transactions gone: it must recover and run handlers again (kept out
            // of the kill loop until it has).
            await eventually(
              async () => (await sql(`SELECT 1 FROM ${q}.runs WHERE pid = $1 AND started_at > to_timestamp($2::bigint / 1000000.0) LIMIT 1`, [victim.pid, contUs])).length > 0,
              15_000,
              'the resumed worker to run a handler again',
            );
            victim.stopped = false;
            Object.assign(stopReport, {
              pid: victim.pid,
              stoppedMs,
              openTransactionsAtStop: atStop.filter((s) => s.state === 'idle in transaction').length,
              claimsAtStop: claims.length,
              claimsRescuedWhileStopped: rescuedAtStop!.n,
              sessionsBlockedByItPeak: blockedPeak,
              serverEndedItsTransactionsAfterMs: sessionsEndedMs,
              completedByOthersWhileStopped: completedWhileStopped,
            });
            return victim;
          })();
          let stopError: unknown;
          void stopping.then(
            () => (stopDone = true),
            (error: unknown) => {
              stopError = error;
              stopDone = true;
            },
          );

          // Kill a random worker every so often and start a replacement, until all is done.
          const killedPids = new Set<number>();
          while (!(duplicatesDone && stopDone && (await counts()).unfinished === 0)) {
            assert.ok(Date.now() - t0 < DEADLINE_MS, `not done after ${DEADLINE_MS} ms: ${JSON.stringify(await counts())}, ${kills} kills`);
            if (stopError) throw stopError;
            await sleep(randomInt(300, 900));
            if (kills >= MAX_KILLS) continue;
            // Kill only while another worker keeps running: on a loaded machine a replacement takes seconds to
            // boot (7 s seen beside crash.test.ts), and kills faster than that left no worker running at all.
            const running = [...children].filter((c) => isLive(c) && !c.stopped && c.workerId);
            if (running.length < 2) continue;
            const candidates = running.filter((c) => Date.now() - c.readyAt >= MIN_UPTIME_MS);
            const victim = candidates[randomInt(0, candidates.length - 1)];
            if (!victim) continue;
            killedPids.add(victim.pid);
            await killChildWorker(victim);
            kills++;
            start();
          }
          sampling = false;
          await sampler;
          if (stopError) throw stopError;
          const mismatched = await duplicates;
          const stoppedChild = await stopping;
          const doneMs = Date.now() - t0;
          await Promise.all([...children].map((c) => killChildWorker(c)));

          // ---- Checks ----
          const jobs = await sql<{ id: string; state: string; attempt: number; n: number; account: number }>(
            `SELECT id, state, attempt, (payload->>'n')::int AS n, (payload->>'account')::int AS account FROM ${q}.jobs`,
          );
          // No job lost, none created twice: duplicate enqueues got the first job's id.
          const extraJobs = jobs.filter((j) => j.id !== idByN[j.n]);
          assert.equal(mismatched, 0, `duplicate enqueues that did not get the id of the job with their key (${extraJobs.length} second jobs: ${sample(extraJobs)})`);
          assert.equal(jobs.length, JOBS, 'one job per dedup key');
          assert.deepEqual(new Set(jobs.map((j) => j.id)), new Set(idByN));
          const notCompleted = jobs.filter((j) => j.state !== 'completed');
          assert.equal(notCompleted.length, 0, `jobs not completed: ${sample(notCompleted)}`);

          // Exactly once: the balances are the number of distinct jobs, in total and per account.
          const accounts = await sql<{ id: number; balance: number }>(`SELECT id, balance FROM ${q}.accounts ORDER BY id`);
          const expected = Array.from({ length: ACCOUNTS }, (_, id) => ({ id, balance: payloads.filter((d) => d.account === id).length }));
          assert.equal(
            accounts.reduce((sum, a) => sum + a.balance, 0),
            JOBS,
            'sum of balances = number of distinct jobs',
          );
          assert.deepEqual(accounts, expected, 'each balance = the number of distinct jobs crediting that account');
          // And each job's ctx.tx effect was committed once, by the claim that completed it.
          const effects = await sql<{ job_id: string; attempt: number }>(`SELECT job_id, attempt FROM ${q}.effects`);
          const effectsByJob = new Map<string, number[]>();
          for (const e of effects) effectsByJob.set(e.job_id, [...(effectsByJob.get(e.job_id) ?? []), e.attempt]);
          const wrongEffects = jobs.filter((j) => {
            const list = effectsByJob.get(j.id) ?? [];
            return list.length !== 1 || list[0] !== j.attempt;
          });
          assert.equal(effects.length, JOBS);
          assert.equal(wrongEffects.length, 0, `jobs without exactly one effect from their completing claim: ${sample(wrongEffects)}`);

          // Not vacuous: kills, the stop, rescues, failures after the write, jobs run more than once.
          const runs = await sql<{ job_id: string; attempt: number; pid: number }>(`SELECT job_id, attempt, pid FROM ${q}.runs`);
          const errors = await sql<{ job_id: string; claim: number; category: string; worker: string }>(`SELECT job_id, claim, category, worker FROM ${q}.job_errors`);
          const rescued = errors.filter((e) => e.category === 'lease-expired');
          const injected = errors.filter((e) => e.category === 'transient');
          const rescuedKeys = new Set(rescued.map((e) => `${e.job_id}/${e.claim}`));
          const killedMidHandler = runs.filter((r) => killedPids.has(r.pid) && rescuedKeys.has(`${r.job_id}/${r.attempt}`));
          const runsPerJob = new Map<string, number>();
          for (const r of runs) runsPerJob.set(r.job_id, (runsPerJob.get(r.job_id) ?? 0) + 1);
          const ranMoreThanOnce = [...runsPerJob.values()].filter((c) => c > 1).length;
          assert.ok(kills >= MIN_KILLS, `only ${kills} kills happened; the test needs at least ${MIN_KILLS}`);
          assert.ok(killedMidHandler.length > 0, 'no kill landed while a handler ran');
          assert.ok((stopReport.claimsRescuedWhileStopped as number) > 0, "no claim of the paused worker's was rescued");
          assert.ok((stopReport.completedByOthersWhileStopped as number) > 0, 'no job completed while a worker was paused');
          assert.ok(injected.length > 0, 'no injected failure after the write happened');
          // Every failed attempt is a rescue or an injected failure (a first attempt of a failFirst job): no
          // deadlock, no refused connection, no other error in a handler or its commit.
          const jobByIdRow = new Map(jobs.map((j) => [j.id, j]));
          const otherFailures = errors.filter(
            (e) => e.category !== 'lease-expired' && !(e.category === 'transient' && e.claim === 1 && payloads[jobByIdRow.get(e.job_id)!.n]!.failFirst),
          );
          assert.equal(otherFailures.length, 0, `failures nobody injected: ${sample(otherFailures)}`);
          assert.ok(ranMoreThanOnce > 0, 'no job ran more than once');
          assert.equal(runsPerJob.size, JOBS, 'every job ran');
          assert.deepEqual(unexpectedExits, [], 'a worker process exited without being killed');

          console.log(
            JSON.stringify({
              test: 'exactly-once effects under faults',
              jobs: JOBS,
              duplicateEnqueues: JOBS,
              workersStarted: spawned.length,
              kills,
              stop: stopReport,
              rescuedClaims: rescued.length,
              rescuedClaimsKilledMidHandler: killedMidHandler.length,
              injectedFailuresAfterWrite: injected.length,
              handlerRuns: runs.length,
              duplicateDeliveries: runs.length - runsPerJob.size,
              jobsRunMoreThanOnce: ranMoreThanOnce,
              maxAttempt: Math.max(...jobs.map((j) => j.attempt)),
              balanceSum: accounts.reduce((sum, a) => sum + a.balance, 0),
              staleResultsRefused: spawned.reduce((sum, c) => sum + c.lines.filter((l) => l.event === 'stale').length, 0),
              workerErrors: spawned.flatMap((c) => c.lines.flatMap((l) => (l.event === 'error' ? [`${c.pid === stoppedChild.pid ? 'paused worker' : c.pid}: ${l.message}`] : []))),
              doneMs,
              totalMs: Date.now() - t0,
            }),
          );
        } finally {
          await closeSchema(schema, mailroom);
        }
      },
    );

    it("a duplicate enqueue racing with the completion of its key's job gets that job's id (retention.dedupKeys)", { timeout: 30_000 }, async () => {
      // Found by the test above: the enqueue's INSERT waits for the completing transaction's row lock, then
      // finds no unfinished job with the key and inserts a second job. Here the completion is held open until
      // the enqueue waits for it. The batch also carries a second job of the same ordering key, queued behind
      // the withdrawn one: it must not stay blocked.
      const { schema, q, mailroom } = await openSchema('fxdup');
      const client = await admin.connect();
      try {
        const first = await mailroom.enqueue(credit, { n: 0, account: 0, failFirst: false }, { key: 'credit:0' });
        await client.query(`UPDATE ${q}.jobs SET state = 'active', attempt = 1, claim_count = 1 WHERE id = $1`, [first]);
        await client.query('BEGIN');
        await client.query(`UPDATE ${q}.jobs SET state = 'completed', finished_at = now(), locked_until = NULL WHERE id = $1`, [first]);
        const { rows } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
        const again = mailroom.enqueueMany(
          credit,
          [
            { n: 0, account: 0, failFirst: false },
            { n: 1, account: 0, failFirst: false },
          ],
          { key: (d) => `credit:${d.n}`, orderingKey: 'account-0' },
        );
        await eventually(
          async () => (await sql(`SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))`, [rows[0]!.pid])).length > 0,
          10_000,
          'the enqueue to wait for the completing transaction',
        );
        await client.query('COMMIT');
        const ids = await again;
        assert.equal(ids[0], first, 'the duplicate got the completed job');
        assert.deepEqual(await sql(`SELECT id, state, blocked FROM ${q}.jobs ORDER BY created_at, id`), [
          { id: first, state: 'completed', blocked: false },
          { id: ids[1], state: 'available', blocked: false },
        ]);
      } finally {
        await client.query('ROLLBACK').catch(() => {});
        client.release();
        await closeSchema(schema, mailroom);
      }
    });

    it(
      'per-key ordering across processes: committed effects in enqueue order per key, no overlapping runs of a key, keys in parallel, with failures and SIGKILL',
      { timeout: 120_000 },
      async () => {
        const t0 = Date.now();
        const { schema, q, mailroom } = await openSchema('ord');
        const KEYS = 40;
        const PER_KEY = 25;
        const JOBS = KEYS * PER_KEY;
        const WORKERS = 3;
        const CONCURRENCY = 5;
        const MAX_KILLS = 4;
        const DEADLINE_MS = 60_000;
        try {
          await sql(`CREATE TABLE ${q}.runs (id uuid PRIMARY KEY, job_id uuid NOT NULL, key text NOT NULL, seq int NOT NULL, attempt int NOT NULL,
            pid int NOT NULL, started_at timestamptz NOT NULL DEFAULT clock_timestamp(), ended_at timestamptz, outcome text)`);
          await sql(`CREATE TABLE ${q}.effects (id bigserial PRIMARY KEY, run_id uuid NOT NULL, job_id uuid NOT NULL, key text NOT NULL, seq int NOT NULL,
            attempt int NOT NULL, pid int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`);
          await sql(`CREATE TABLE ${q}.tput (job_id uuid NOT NULL, key text NOT NULL, seq int NOT NULL)`);

          const keys = Array.from({ length: KEYS }, (_, k) => `account-${k}`);
          // Interleaved across keys, in several statements; about one job in six fails its first attempt.
          for (let seq = 0; seq < PER_KEY; seq += 5) {
            const batch = keys.flatMap((key, k) => Array.from({ length: 5 }, (_, i) => ({ key, seq: seq + i, failFirst: ((seq + i) * 7 + k) % 6 === 0 })));
            await mailroom.enqueueMany(step, batch, { orderingKey: (d) => d.key });
          }

          const config: EffectsWorkerConfig = {
            url: url!,
            schema,
            mode: 'ordered',
            concurrency: CONCURRENCY,
            lease: '2s',
            rescueInterval: '250ms',
            pollInterval: '100ms',
            sleepMs: [5, 25],
            retry: STEP_RETRY,
            appPrefix: `ord${process.pid}`,
          };
          const spawned: Child[] = [];
          const start = () => {
            const child = spawnChild(config);
            spawned.push(child);
            return child;
          };
          for (let i = 0; i < WORKERS; i++) start();
          await Promise.all(spawned.map((c) => c.ready));

          const completed = async (type: string, run?: string) =>
            (
              await sql<{ n: number }>(
                `SELECT count(*)::int AS n FROM ${q}.jobs WHERE type = $1 AND state = 'completed' AND ($2::text IS NULL OR payload->>'run' = $2)`,
                [type, run ?? null],
              )
            )[0]!.n;

          // SIGKILL a worker while it runs handlers, at about 25% and 55% of the run (more if a kill found it idle).
          const killAtUs = new Map<number, number>();
          let landed = 0;
          let kills = 0;
          for (const fraction of [0.25, 0.55]) {
            await eventually(async () => (await completed(step.name)) >= JOBS * fraction, DEADLINE_MS, `${fraction * 100}% of the ordered jobs`);
            let landedNow = false;
            while (!landedNow && kills < MAX_KILLS) {
              assert.ok(Date.now() - t0 < DEADLINE_MS, `no worker with a running handler to kill after ${DEADLINE_MS} ms`);
              if ((await completed(step.name)) === JOBS) break;
              const live = [...children].filter((c) => isLive(c) && c.workerId);
              const open = await sql<{ pid: number; n: number }>(
                `SELECT pid, count(*)::int AS n FROM ${q}.runs WHERE ended_at IS NULL AND pid = ANY($1::int[]) GROUP BY pid ORDER BY n DESC`,
                [live.map((c) => c.pid)],
              );
              const victim = live.find((c) => c.pid === open[0]?.pid);
              if (!victim) {
                await sleep(20);
                continue;
              }
              await killChildWorker(victim);
              killAtUs.set(victim.pid, Number(await dbNow()));
              kills++;
              start();
              const [cut] = await sql<{ n: number }>(`SELECT count(*)::int AS n FROM ${q}.runs WHERE pid = $1 AND ended_at IS NULL`, [victim.pid]);
              if (cut!.n > 0) {
                landed += cut!.n;
                landedNow = true;
              }
            }
          }
          await eventually(async () => (await completed(step.name)) === JOBS, Math.max(5_000, DEADLINE_MS - (Date.now() - t0)), 'every ordered job to complete');
          const orderedDoneMs = Date.now() - t0;

          // ---- Checks (the ordered run is over; nothing of it runs any more) ----
          const jobs = await sql<{ id: string; key: string; seq: number; state: string; attempt: number }>(
            `SELECT id, payload->>'key' AS key, (payload->>'seq')::int AS seq, state, attempt FROM ${q}.jobs WHERE type = $1`,
            [step.name],
          );
          assert.equal(jobs.length, JOBS);
          assert.ok(jobs.every((j) => j.state === 'completed'));
          const jobById = new Map(jobs.map((j) => [j.id, j]));

          // 1. Committed effects (ctx.tx): per key exactly seq 0..24, in the order they were written (effects.id),
          //    each from the claim that completed its job.
          const effects = await sql<{ run_id: string; job_id: string; key: string; seq: number; attempt: number }>(
            `SELECT run_id, job_id, key, seq, attempt FROM ${q}.effects ORDER BY id`,
          );
          const effectSeqs = new Map<string, number[]>();
          for (const e of effects) effectSeqs.set(e.key, [...(effectSeqs.get(e.key) ?? []), e.seq]);
          const expectedSeqs = Array.from({ length: PER_KEY }, (_, i) => i);
          const badKeys = keys.filter((k) => JSON.stringify(effectSeqs.get(k)) !== JSON.stringify(expectedSeqs));
          assert.equal(badKeys.length, 0, `keys whose committed effects are not exactly ${PER_KEY} in enqueue order: ${sample(badKeys.map((k) => ({ k, seqs: effectSeqs.get(k) })))}`);
          const foreign = effects.filter((e) => jobById.get(e.job_id)?.attempt !== e.attempt);
          assert.equal(foreign.length, 0, `effects not committed by the completing claim: ${sample(foreign)}`);
          const committedRuns = new Set(effects.map((e) => e.run_id));

          // 2. Runs (autocommit records of what ran, killed and failed ones included).
          type Run = { id: string; job_id: string; key: string; seq: number; attempt: number; pid: number; start: number; end: number | null; outcome: string | null };
          const runs = (
            await sql<{ id: string; job_id: string; key: string; seq: number; attempt: number; pid: number; start: string; end: string | null; outcome: string | null }>(
              `SELECT id, job_id, key, seq, attempt, pid, outcome,
                      (extract(epoch FROM started_at) * 1000000)::bigint AS start, (extract(epoch FROM ended_at) * 1000000)::bigint AS "end"
                 FROM ${q}.runs`,
            )
          ).map((r): Run => ({ ...r, start: Number(r.start), end: r.end === null ? null : Number(r.end) }));
          // A run is known by its job and attempt, and so is each error here: a follower handed back unstarted
          // (the job before it failed) spent no attempt but used a claim, so claim counts run ahead of attempts.
          const errors = await sql<{ job_id: string; claim: number; category: string }>(`SELECT job_id, attempt AS claim, category FROM ${q}.job_errors`);
          const rescuedClaims = new Set(errors.filter((e) => e.category === 'lease-expired').map((e) => `${e.job_id}/${e.claim}`));
          // A run without an end is one whose process was killed: its end is bounded by the kill (DB clock, read after the exit).
          const unended = runs.filter((r) => r.end === null && !killAtUs.has(r.pid));
          assert.equal(unended.length, 0, `runs of live workers that never ended: ${sample(unended)}`);
          const endOf = (r: Run) => r.end ?? killAtUs.get(r.pid)!;

          const runsByKey = new Map<string, Run[]>();
          for (const r of runs) runsByKey.set(r.key, [...(runsByKey.get(r.key) ?? []), r]);
          const outOfOrder: unknown[] = [];
          const overlaps: unknown[] = [];
          let fencedOverlaps = 0;
          for (const [key, list] of runsByKey) {
            list.sort((a, b) => a.start - b.start);
            // Runs of a key start in enqueue order (a retry of seq s before anything of s+1), always: a job's
            // runs all start before it completes, and the next job of its key is blocked until then.
            for (let i = 1; i < list.length; i++) if (list[i]!.seq < list[i - 1]!.seq) outOfOrder.push({ key, prev: list[i - 1], next: list[i] });
            // No two runs of a key overlap in time: run b must start at or after the end of every run a that
            // started before it. A run's end is its own stamp, written just before its commit or its failure
            // record (the key is held until those, so this is a necessary condition); a killed run has no stamp
            // and ends by the time of the kill. The one allowed exception is fencing: a run whose claim was
            // rescued (lease expired: its worker was killed, paused, or its heartbeats were late) may still
            // be running when the next claim of its key starts. That is allowed only if the earlier run is
            // such a rescued claim AND nothing it wrote through ctx.tx committed. A SIGKILLed process is gone
            // before its lease can expire, so this test expects none; they are counted, not failed.
            for (let i = 0; i < list.length; i++) {
              for (let j = i + 1; j < list.length; j++) {
                const a = list[i]!;
                const b = list[j]!;
                if (b.start >= endOf(a)) continue;
                if (rescuedClaims.has(`${a.job_id}/${a.attempt}`) && !committedRuns.has(a.id)) fencedOverlaps++;
                else overlaps.push({ key, a, b });
              }
            }
          }
          assert.equal(outOfOrder.length, 0, `runs of a key that started out of enqueue order: ${sample(outOfOrder)}`);
          assert.equal(overlaps.length, 0, `runs of one key that overlapped in time: ${sample(overlaps)}`);

          // No claim ran twice (a claim is delivered once; a redelivery is a new claim).
          const claimKeys = runs.map((r) => `${r.job_id}/${r.attempt}`);
          assert.equal(new Set(claimKeys).size, runs.length, 'a claim ran twice');

          // 3. Different keys ran in parallel: the most runs in progress at once (runs of one key do not
          //    overlap, as checked above, so these are runs of different keys).
          const points = runs.flatMap((r) => [
            { t: r.start, d: 1 },
            { t: endOf(r), d: -1 },
          ]);
          points.sort((a, b) => a.t - b.t || a.d - b.d);
          let inProgress = 0;
          let maxParallelKeys = 0;
          for (const p of points) maxParallelKeys = Math.max(maxParallelKeys, (inProgress += p.d));
          assert.ok(maxParallelKeys > 1, `different keys never ran in parallel (max ${maxParallelKeys})`);

          // Not vacuous: a kill landed mid-handler and its claims were rescued; injected failures were retried.
          const injected = errors.filter((e) => e.category === 'transient');
          const rescuedKilled = runs.filter((r) => killAtUs.has(r.pid) && r.end === null && rescuedClaims.has(`${r.job_id}/${r.attempt}`));
          assert.ok(kills >= 1 && landed > 0, `no SIGKILL landed while a handler ran (${kills} kills)`);
          assert.ok(rescuedKilled.length > 0, 'no claim of a killed worker was rescued');
          assert.ok(injected.length > 0, 'no injected failure happened');
          // Each injected failure was recorded as a failed attempt of its claim (or, if its worker was killed
          // between the throw and the record, as a rescue), and no other failure happened.
          const categoryOf = new Map(errors.map((e) => [`${e.job_id}/${e.claim}`, e.category]));
          const threw = runs.filter((r) => r.outcome === 'threw');
          const unrecorded = threw.filter((r) => {
            const category = categoryOf.get(`${r.job_id}/${r.attempt}`);
            return !(category === 'transient' || (category === 'lease-expired' && killAtUs.has(r.pid)));
          });
          const threwClaims = new Set(threw.map((r) => `${r.job_id}/${r.attempt}`));
          const unexplained = errors.filter((e) => e.category !== 'lease-expired' && !(e.category === 'transient' && threwClaims.has(`${e.job_id}/${e.claim}`)));
          assert.equal(unrecorded.length, 0, `injected failures not recorded: ${sample(unrecorded)}`);
          assert.equal(unexplained.length, 0, `failures nobody injected: ${sample(unexplained)}`);

          // ---- Throughput (printed, not asserted): the same workload with and without ordering keys, run by the
          // same live processes (same concurrency), handler = one ctx.tx insert. Measured on the database clock
          // from the enqueue statement to the last completion.
          await Promise.all([...children].map((c) => c.ready));
          const throughput: Record<string, { jobs: number; ms: number; perSecond: number; processingMs: number }[]> = { unordered: [], ordered: [] };
          const plan: ('unordered' | 'ordered')[] = ['unordered', 'ordered', 'unordered', 'ordered'];
          for (const [i, kind] of plan.entries()) {
            const run = `${kind}-${i}`;
            const batch = keys.flatMap((key) => Array.from({ length: PER_KEY }, (_, seq) => ({ key, seq, failFirst: false, run })));
            // Enqueued as seq-major rows, so every key's jobs spread across the table as in the ordered run.
            batch.sort((a, b) => a.seq - b.seq);
            await mailroom.enqueueMany(tput, batch, kind === 'ordered' ? { orderingKey: (d) => d.key } : {});
            await eventually(async () => (await completed(tput.name, run)) === JOBS, 30_000, `the ${kind} throughput run`);
            // ms: from the enqueue statement to the last completion; processingMs: from the first claim.
            const [m] = await sql<{ ms: number; processing_ms: number }>(
              `SELECT extract(epoch FROM max(finished_at) - min(created_at))::float8 * 1000 AS ms,
                      extract(epoch FROM max(finished_at) - min(started_at))::float8 * 1000 AS processing_ms
                 FROM ${q}.jobs WHERE type = $1 AND payload->>'run' = $2`,
              [tput.name, run],
            );
            throughput[kind]!.push({ jobs: JOBS, ms: Math.round(m!.ms), perSecond: Math.round((JOBS / m!.ms) * 1000), processingMs: Math.round(m!.processing_ms) });
          }
          const best = (list: { perSecond: number }[]) => Math.max(...list.map((r) => r.perSecond));
          assert.deepEqual(unexpectedExits, [], 'a worker process exited without being killed');

          console.log(
            JSON.stringify({
              test: 'per-key ordering across processes',
              keys: KEYS,
              jobsPerKey: PER_KEY,
              jobs: JOBS,
              workers: WORKERS,
              concurrency: CONCURRENCY,
              kills,
              runsCutByKills: landed,
              rescuedClaimsOfKilledWorkers: rescuedKilled.length,
              injectedFailures: injected.length,
              handlerRuns: runs.length,
              extraRuns: runs.length - JOBS,
              fencedOverlaps,
              maxParallelKeys,
              orderedRunMs: orderedDoneMs,
              throughput,
              orderedVsUnordered: Number((best(throughput.ordered!) / best(throughput.unordered!)).toFixed(2)),
              totalMs: Date.now() - t0,
            }),
          );
        } finally {
          await closeSchema(schema, mailroom);
        }
      },
    );
  },
);
