/**
 * Race tests (issue #8): fast-check's scheduler chooses the order of the database
 * steps of several actors (workers, maintenance, an operator) around one job, and
 * shrinks a failing order to a minimal one. Every interleaving of whole statements
 * runs on both databases (`stepwise`); on PostgreSQL the steps also really overlap
 * on separate connections (`overlap`). What must hold in every order: no job is
 * claimed twice, exactly one of a stale and a current attempt wins, and the
 * loser's write is refused by the fencing predicate.
 *
 * RACE_RUNS=500 node --import tsx --test test/races.test.ts   # a longer run
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { defineJob } from '../src/index.ts';
import { quoteSchema } from '../src/identifiers.ts';
import { jobQueries, type JobQueries } from '../src/jobs/queries.ts';
import { connect } from '../src/storage/connect.ts';
import type { Driver } from '../src/storage/driver.ts';
import type { ClaimedRow } from '../src/worker/types.ts';
import { completeInTransaction, HandlerTransaction } from '../src/worker/handler-tx.ts';
import { testDatabases, type TestDatabase, type TestMailroom } from './helpers/databases.ts';
import { interleave, type Mode } from './helpers/interleave.ts';

const QUEUE = 'race';
const raceJob = defineJob<{ n: number }>('race.job', { queue: QUEUE, retry: { maxAttempts: 5, backoff: { base: '0ms', max: '0ms' } } });
const RUNS = Number(process.env.RACE_RUNS ?? 40);
const LEASE_MS = 3_600_000;

interface Bench extends TestMailroom {
  driver: Driver;
  queries: JobQueries;
  s: string;
  reset(): Promise<void>;
  /** Claims up to n jobs, with up to `followers` jobs behind each head of an ordering key and behind each anchor (a claimed job). */
  claim(n: number, worker: string, followers?: number, anchors?: ClaimedRow[]): Promise<ClaimedRow[]>;
  /** Makes the job's lease run out (the worker paused past it). */
  expire(id: string): Promise<void>;
  row(id: string): Promise<{ state: string; claim_count: number; attempt: number; locked_until: Date | null }>;
}

async function openBench(db: TestDatabase, after: (fn: () => Promise<void>) => void): Promise<Bench> {
  const opened = await db.open();
  const driver = await connect(await db.handle(), 2);
  after(() => driver.close());
  const s = quoteSchema(opened.schema);
  const queries = jobQueries(s);
  await opened.sql(`CREATE TABLE ${s}.race_effects (job_id uuid NOT NULL, claim int NOT NULL)`);
  return {
    ...opened,
    driver,
    queries,
    s,
    reset: async () => {
      await opened.sql(`TRUNCATE ${s}.jobs, ${s}.job_errors, ${s}.ordering_keys, ${s}.race_effects CASCADE`);
    },
    claim: async (n, worker, followers = 0, anchors = []) =>
      (await driver.run<ClaimedRow>(queries.claimWithFollowers, [QUEUE, n, LEASE_MS, worker, followers, anchors.map((a) => a.id), anchors.map((a) => a.claim_count), n])).rows,
    expire: async (id) => {
      await opened.sql(`UPDATE ${s}.jobs SET locked_until = now() - interval '1 second' WHERE id = $1`, [id]);
    },
    row: async (id) =>
      (await opened.sql<{ state: string; claim_count: number; attempt: number; locked_until: Date | null }>(
        `SELECT state, claim_count, attempt, locked_until FROM ${s}.jobs WHERE id = $1`,
        [id],
      ))[0]!,
  };
}

/** The modes a database supports: PGlite has one connection, so nothing overlaps there. */
function modes(db: TestDatabase): fc.Arbitrary<Mode> {
  return db.name === 'postgres' ? fc.constantFrom<Mode>('stepwise', 'overlap') : fc.constant<Mode>('stepwise');
}

for (const db of testDatabases()) {
  test(`${db.name}: workers claiming at once never claim a job twice, nor jobs of one ordering key in two workers or out of order`, async (t) => {
    const bench = await openBench(db, (fn) => t.after(fn));
    await fc.assert(
      fc.asyncProperty(
        fc.scheduler(),
        modes(db),
        fc.array(fc.constantFrom<string | null>(null, 'a', 'b'), { minLength: 1, maxLength: 8 }),
        fc.array(fc.array(fc.integer({ min: 1, max: 4 }), { minLength: 1, maxLength: 3 }), { minLength: 2, maxLength: 3 }),
        fc.constantFrom(0, 2),
        async (s, mode, keys, workers, followers) => {
          await bench.reset();
          for (const [n, key] of keys.entries()) await bench.mailroom.enqueue(raceJob, { n }, key === null ? {} : { orderingKey: key });
          // Each worker's later claims also extend its chains: the last job it holds of each key is an anchor.
          const held = workers.map(() => new Map<string, ClaimedRow>());
          const claimAs = (w: number, n: number) => async () => {
            const rows = await bench.claim(n, `w${w}`, followers, followers > 0 ? [...held[w]!.values()] : []);
            for (const row of rows) {
              const tail = row.ordering_key === null ? undefined : held[w]!.get(row.ordering_key);
              if (row.ordering_key !== null && (tail === undefined || BigInt(tail.ordering_seq!) < BigInt(row.ordering_seq!))) held[w]!.set(row.ordering_key, row);
            }
            return rows;
          };
          const actors = Object.fromEntries(workers.map((batches, w) => [`worker ${w}`, batches.map((n) => claimAs(w, n))]));
          const results = await interleave(s, mode, actors);
          const claimed = Object.values(results).flat(2) as ClaimedRow[];
          const ids = claimed.map((r) => r.id);
          assert.equal(new Set(ids).size, ids.length, 'a job was claimed twice');
          const active = await bench.sql<{ id: string; ordering_key: string | null; claim_count: number; locked_by: string; blocked: boolean }>(
            `SELECT id, ordering_key, claim_count, locked_by, blocked FROM ${bench.s}.jobs WHERE state = 'active' ORDER BY id`,
          );
          assert.deepEqual(active.map((r) => r.id), [...ids].sort(), 'the active jobs are exactly the claimed ones');
          assert.ok(active.every((r) => r.claim_count === 1));
          const heads = active.flatMap((r) => (r.ordering_key === null || r.blocked ? [] : [r.ordering_key]));
          assert.equal(new Set(heads).size, heads.length, 'two heads of one ordering key are active at once');
          if (followers === 0) assert.ok(active.every((r) => !r.blocked), 'no follower claimed when none was asked for');
          for (const key of new Set(active.flatMap((r) => (r.ordering_key === null ? [] : [r.ordering_key])))) {
            const ofKey = active.filter((r) => r.ordering_key === key);
            assert.equal(new Set(ofKey.map((r) => r.locked_by)).size, 1, `the active jobs of key ${key} belong to one worker`);
            assert.equal(ofKey.filter((r) => !r.blocked).length, 1, `key ${key} has one head among its active jobs`);
          }
          // The active jobs of a key are its first ones: none waiting comes before an active one.
          const skipped = await bench.sql<{ n: number }>(
            `SELECT count(*)::int AS n FROM ${bench.s}.jobs AS w
              WHERE w.state = 'available' AND EXISTS (SELECT 1 FROM ${bench.s}.jobs AS a WHERE a.state = 'active'
                AND a.ordering_key = w.ordering_key AND a.ordering_seq > w.ordering_seq)`,
          );
          assert.equal(skipped[0]!.n, 0, 'a job of a key was claimed ahead of an earlier one');
          // Nothing claimable was left while a claim came back short in stepwise order (in overlap, SKIP LOCKED may).
          if (mode === 'stepwise' && workers.flat().reduce((a, b) => a + b, 0) > claimed.filter((r) => !r.blocked).length) {
            const left = await bench.sql<{ n: number }>(`SELECT count(*)::int AS n FROM ${bench.s}.jobs WHERE state = 'available' AND NOT blocked`);
            assert.equal(left[0]!.n, 0, 'claims came back short with jobs left to claim');
          }
        },
      ),
      { numRuns: RUNS, includeErrorInReport: true },
    );
  });

  test(`${db.name}: a chain broken by a failure is never extended: a claim's followers come right after their head or anchor`, async (t) => {
    // The worker keeps passing the tails of its chains as anchors after the job before them failed (it has
    // not seen the failure yet), and claims that job again as a head: the followers of one claim must still
    // be the first unfinished jobs after their lead, with nothing of the key between (checked at each claim,
    // the steps running one at a time).
    const bench = await openBench(db, (fn) => t.after(fn));
    await fc.assert(
      fc.asyncProperty(
        fc.scheduler(),
        fc.array(fc.constantFrom('a', 'b'), { minLength: 3, maxLength: 10 }),
        fc.array(fc.integer({ min: 1, max: 3 }), { minLength: 2, maxLength: 5 }),
        fc.array(fc.constantFrom('a', 'b'), { minLength: 1, maxLength: 3 }),
        async (s, keys, batches, failures) => {
          await bench.reset();
          for (const [n, key] of keys.entries()) await bench.mailroom.enqueue(raceJob, { n }, { orderingKey: key });
          const tails = new Map<string, ClaimedRow>();
          const claim = (n: number) => async () => {
            const anchors = [...tails.values()];
            const rows = await bench.claim(n, 'w', 2, anchors);
            for (const key of ['a', 'b']) {
              const followers = rows.filter((r) => r.ordering_key === key && r.blocked);
              if (followers.length === 0) continue;
              const lead = rows.find((r) => r.ordering_key === key && !r.blocked) ?? anchors.find((a) => a.ordering_key === key)!;
              const first = followers.map((r) => BigInt(r.ordering_seq!)).reduce((a, b) => (a < b ? a : b));
              const between = await bench.sql<{ n: number }>(
                `SELECT count(*)::int AS n FROM ${bench.s}.jobs WHERE ordering_key = $1 AND ordering_seq > $2 AND ordering_seq < $3
                    AND state IN ('scheduled', 'available', 'active', 'retrying') AND NOT (id = ANY($4::uuid[]))`,
                [key, lead.ordering_seq, first.toString(), followers.map((r) => r.id)],
              );
              assert.equal(between[0]!.n, 0, `followers of key ${key} claimed with jobs of the key between them and their lead`);
            }
            for (const row of rows) {
              const tail = tails.get(row.ordering_key!);
              if (tail === undefined || BigInt(tail.ordering_seq!) < BigInt(row.ordering_seq!)) tails.set(row.ordering_key!, row);
            }
            return rows.length;
          };
          // Fails the key's running head, to be retried at once: its first unfinished job, if active (a
          // follower runs only once every job before it completed, so only that one can fail).
          const fail = (key: string) => async () => {
            const [head] = await bench.sql<{ id: string; claim_count: number; state: string }>(
              `SELECT id, claim_count, state FROM ${bench.s}.jobs WHERE ordering_key = $1 AND state IN ('scheduled', 'available', 'active', 'retrying')
                ORDER BY ordering_seq LIMIT 1`,
              [key],
            );
            if (head?.state !== 'active') return false;
            await bench.driver.run(bench.queries.fail, [head.id, head.claim_count, true, 0, 'max-attempts', 'transient', 'failed', null]);
            return true;
          };
          await interleave(s, 'stepwise', { worker: batches.map(claim), failer: failures.map(fail) });
        },
      ),
      { numRuns: RUNS, includeErrorInReport: true },
    );
  });

  test(`${db.name}: a stale worker's completion racing the rescue and the next claim: exactly one attempt wins`, async (t) => {
    const bench = await openBench(db, (fn) => t.after(fn));
    await fc.assert(
      fc.asyncProperty(fc.scheduler(), modes(db), fc.constantFrom('complete', 'fail'), async (s, mode, stale) => {
        await bench.reset();
        const id = await bench.mailroom.enqueue(raceJob, { n: 1 });
        const [first] = await bench.claim(1, 'paused');
        await bench.expire(id); // the first worker was paused past its lease
        let nextClaim: number | null = null;
        const results = await interleave(s, mode, {
          paused: [
            async () =>
              stale === 'complete'
                ? (await bench.driver.run(bench.queries.complete, [[id], [first!.claim_count]])).rowCount === 1
                : (await bench.driver.run(bench.queries.fail, [id, first!.claim_count, true, 0, 'max-attempts', 'transient', 'late failure', null])).rowCount === 1,
          ],
          maintenance: [async () => (await bench.mailroom.maintain()).rescued],
          next: [
            async () => (nextClaim = (await bench.claim(1, 'next'))[0]?.claim_count ?? null),
            // The next worker completes what it claimed (if anything).
            async () => nextClaim !== null && (await bench.driver.run(bench.queries.complete, [[id], [nextClaim]])).rowCount === 1,
          ],
        });
        const staleWon = results.paused![0] as boolean;
        const rescued = results.maintenance![0] as number;
        const nextWon = results.next![1] as boolean;
        // The paused worker may still finish if nobody took the job over yet; after the rescue it cannot.
        assert.equal(staleWon, rescued === 0, `the stale ${stale} took effect: ${staleWon}, rescued: ${rescued}`);
        if (stale === 'complete') assert.ok(!(staleWon && nextWon), 'both attempts completed the job');
        if (nextClaim !== null) assert.equal(nextClaim, 2);
        assert.equal((await bench.row(id)).state, (stale === 'complete' && staleWon) || nextWon ? 'completed' : 'retrying');
        const errors = await bench.sql<{ claim: number; category: string }>(`SELECT claim, category FROM ${bench.s}.job_errors WHERE job_id = $1`, [id]);
        // One error for the first attempt: the stale failure's or the rescue's, never both.
        const expected = staleWon ? (stale === 'fail' ? [{ claim: 1, category: 'transient' }] : []) : [{ claim: 1, category: 'lease-expired' }];
        assert.deepEqual(errors, expected);
      }),
      { numRuns: RUNS, includeErrorInReport: true },
    );
  });

  test(`${db.name}: a heartbeat racing a rescue and the completion: the lease is either renewed or lost, never both`, async (t) => {
    const bench = await openBench(db, (fn) => t.after(fn));
    await fc.assert(
      fc.asyncProperty(fc.scheduler(), modes(db), async (s, mode) => {
        await bench.reset();
        const id = await bench.mailroom.enqueue(raceJob, { n: 1 });
        const [claimed] = await bench.claim(1, 'w');
        await bench.expire(id); // a heartbeat is late
        const token = [[id], [claimed!.claim_count]];
        const results = await interleave(s, mode, {
          worker: [
            async () => (await bench.driver.run(bench.queries.heartbeat, [...token, LEASE_MS])).rowCount === 1,
            async () => (await bench.driver.run(bench.queries.complete, token)).rowCount === 1,
            async () => (await bench.driver.run(bench.queries.heartbeat, [...token, LEASE_MS])).rowCount === 1,
          ],
          maintenance: [async () => (await bench.mailroom.maintain()).rescued],
        });
        const [renewed, completed, lateBeat] = results.worker as boolean[];
        const rescued = results.maintenance![0] as number;
        const row = await bench.row(id);
        assert.equal(lateBeat, false, 'a heartbeat after the completion renewed a finished job');
        assert.equal(completed, rescued === 0, 'the completion and the rescue both took effect, or neither');
        if (renewed) assert.equal(rescued, 0, 'a renewed lease was rescued');
        assert.equal(row.state, completed ? 'completed' : 'retrying');
        if (completed) assert.equal(row.locked_until, null);
      }),
      { numRuns: RUNS, includeErrorInReport: true },
    );
  });

  test(`${db.name}: cancel and retry racing a claim: the job is claimed once or cancelled, never both`, async (t) => {
    const bench = await openBench(db, (fn) => t.after(fn));
    await fc.assert(
      fc.asyncProperty(fc.scheduler(), modes(db), fc.constantFrom('cancel', 'retry'), fc.boolean(), async (s, mode, action, waitingLater) => {
        await bench.reset();
        // A job due now, or one retrying in an hour (claimable only once jobs.retry runs it now).
        const id = await bench.mailroom.enqueue(raceJob, { n: 1 }, waitingLater ? { delay: '1h' } : {});
        const results = await interleave(s, mode, {
          claims: [async () => bench.claim(1, 'a'), async () => bench.claim(1, 'b')],
          operator: [async () => (action === 'cancel' ? bench.mailroom.jobs.cancel(id) : bench.mailroom.jobs.retry(id))],
        });
        const claimed = (results.claims as ClaimedRow[][]).flat();
        const done = results.operator![0] as { changed: boolean; state: string | undefined };
        const row = await bench.row(id);
        assert.ok(claimed.length <= 1, 'claimed twice');
        if (action === 'cancel') {
          assert.ok(!(done.changed && claimed.length === 1), 'cancelled and claimed');
          assert.equal(row.state, claimed.length === 1 ? 'active' : 'cancelled');
          if (!done.changed) assert.equal(done.state, 'active');
        } else if (waitingLater) {
          // Delayed: claimable only once the retry made it due.
          assert.deepEqual(done, { changed: true, state: 'available' });
          assert.equal(row.state, claimed.length === 1 ? 'active' : 'available');
        } else {
          // Overlapping, both claims may skip the row while the retry holds its lock (SKIP LOCKED): the
          // job stays available for the next poll. One at a time, a claim always finds it.
          if (mode === 'stepwise') assert.equal(claimed.length, 1, 'a job due now was not claimed');
          assert.equal(row.state, claimed.length === 1 ? 'active' : 'available');
          assert.ok(done.changed ? done.state === 'available' : done.state === 'active', JSON.stringify(done));
        }
        assert.ok(claimed.every((r) => r.claim_count === 1));
      }),
      { numRuns: RUNS, includeErrorInReport: true },
    );
  });
}

// A completion through ctx.tx holds its own transaction open while the rescue and the next claim run:
// PostgreSQL only (PGlite has one connection, which that transaction would hold).
for (const db of testDatabases().filter((d) => d.name === 'postgres')) {
  test(`${db.name}: a stale ctx.tx completion racing the rescue and the next attempt: one effect, the winner's`, async (t) => {
    const bench = await openBench(db, (fn) => t.after(fn));
    await fc.assert(
      fc.asyncProperty(fc.scheduler(), modes(db), async (s, mode) => {
        await bench.reset();
        const id = await bench.mailroom.enqueue(raceJob, { n: 1 });
        const [first] = await bench.claim(1, 'paused');
        await bench.expire(id);
        const attempt = (claim: () => Promise<number | null>) => {
          let tx: HandlerTransaction | undefined;
          let token: number | null = null;
          return [
            async () => {
              token = await claim();
              if (token === null) return;
              tx = new HandlerTransaction(bench.driver, id, LEASE_MS);
              await tx.queryable.query(`INSERT INTO ${bench.s}.race_effects (job_id, claim) VALUES ($1, $2)`, [id, token]);
            },
            async () => (tx && token !== null ? tx.commitWith(completeInTransaction(bench.queries, id, token)) : false),
          ];
        };
        const results = await interleave(s, mode, {
          paused: attempt(async () => first!.claim_count),
          maintenance: [async () => (await bench.mailroom.maintain()).rescued],
          next: attempt(async () => (await bench.claim(1, 'next'))[0]?.claim_count ?? null),
        });
        const staleWon = results.paused![1] as boolean;
        const nextWon = results.next![1] as boolean;
        const effects = await bench.sql<{ claim: number }>(`SELECT claim FROM ${bench.s}.race_effects WHERE job_id = $1`, [id]);
        assert.ok(!(staleWon && nextWon), 'both attempts committed');
        assert.deepEqual(
          effects.map((e) => e.claim),
          staleWon ? [1] : nextWon ? [2] : [],
          'the effects are exactly the winning attempt’s',
        );
        assert.equal((await bench.row(id)).state, staleWon || nextWon ? 'completed' : 'retrying');
      }),
      { numRuns: RUNS, includeErrorInReport: true },
    );
  });
}
