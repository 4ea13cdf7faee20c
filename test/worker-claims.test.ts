/**
 * How often an idle worker claims: once a claim found less than it had room
 * for, new work announces itself (NOTIFY, the poll, the NOTIFY of a key's
 * next job unblocked by a completion), so finishing a job on a queue without
 * shared limits is no reason to claim again. It used to be: every job of a
 * trickle cost a second, empty claim (every keyed job, until session 26).
 */
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { createMailroom, defineJob, type Job, type Worker } from '../src/index.ts';
import { CLAIM_RETURNING } from '../src/jobs/queries.ts';
import type { ClaimedRow } from '../src/worker/types.ts';
import { databaseUrl, testDatabases, uniqueSchema } from './helpers/databases.ts';
import { eventually, waitForEvents } from './helpers/events.ts';
import { beforeEachStatement } from './helpers/pool-statements.ts';

const chore = defineJob<{ n: number }>('claims.chore', { queue: 'claims' });
const JOBS = 30;

describe('claims of an idle worker', { skip: databaseUrl ? false : 'needs TEST_DATABASE_URL' }, () => {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 6 });
  const schema = uniqueSchema('claims');
  after(async () => {
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await pool.end();
  });

  for (const keyed of [false, true]) {
    it(`a trickle of jobs ${keyed ? 'with' : 'without'} ordering keys costs one claim per job, not two`, async () => {
      const mailroom = await createMailroom({ database: pool, schema });
      await mailroom.migrate();
      // Claims counted on every connection the pool hands out (mailroom runs its statements on checked-out clients).
      let claims = 0;
      beforeEachStatement(pool, (name) => void (name.startsWith('mailroom_claim_') && claims++));
      const worker = mailroom.worker({ queues: ['claims'], concurrency: 4, handlers: { [chore.name]: async () => {} } });
      await worker.start();
      try {
        await new Promise((r) => setTimeout(r, 300)); // idle: registered for NOTIFY, settled
        const before = claims;
        for (let n = 0; n < JOBS; n++) {
          const done = waitForEvents(worker, 'completed', 1);
          // Keyed: three keys in turn, each job's key free again by the time the next job of it comes.
          await mailroom.enqueue(chore, { n }, keyed ? { orderingKey: `key-${n % 3}` } : {});
          await done;
          await new Promise((r) => setTimeout(r, 20)); // the completion is written, the worker sleeps again
        }
        const perJob = (claims - before) / JOBS;
        // One claim per NOTIFY; a few more while the wake-up gate settles. Two per job before the change.
        assert.ok(perJob >= 1 && perJob < 1.5, `${claims - before} claims for ${JOBS} jobs`);
      } finally {
        await worker.stop();
        await mailroom.close();
      }
    });
  }

  /** Claims sent through the pool wait here while it is shut; each one that reaches it is counted. */
  const gate = { shut: false, held: 0, open: (): void => {} };
  beforeEachStatement(pool, (name) => {
    if (!name.startsWith('mailroom_claim_') || !gate.shut) return;
    gate.held++;
    return new Promise<void>((resolve) => {
      gate.open = () => {
        gate.shut = false;
        resolve();
      };
    });
  });

  /** The worker would take a hand-off of its whole capacity now. */
  const offersAll = (worker: Worker): boolean => worker.handOffRoom('claims') === worker.capacity;

  /**
   * An idle worker (concurrency 3, offering its whole capacity to a hand-off) whose claim of a job
   * just enqueued waits at the gate; `body` runs then, and `prepare` before the worker starts.
   */
  async function withClaimAtGate(
    body: (worker: Worker, done: Promise<unknown>) => Promise<void>,
    prepare: (worker: Worker) => void = () => {},
  ): Promise<void> {
    const mailroom = await createMailroom({ database: pool, schema });
    await mailroom.migrate();
    const worker = mailroom.worker({ queues: ['claims'], concurrency: 3, handlers: { [chore.name]: async () => {} } });
    prepare(worker);
    await worker.start();
    try {
      await eventually(() => offersAll(worker), 5000, 'the idle worker to offer its whole capacity');
      gate.held = 0;
      gate.shut = true;
      const done = waitForEvents(worker, 'completed', 1);
      await mailroom.enqueue(chore, { n: 1 }); // its NOTIFY starts a claim, which waits at the gate
      await eventually(() => gate.held > 0, 5000, 'a claim at the gate');
      await body(worker, done);
    } finally {
      gate.open();
      await worker.stop();
      await mailroom.close();
    }
  }

  it('an idle worker offers no room to a hand-off while a claim of its own is in flight, and offers it again once the claim came back', async () => {
    await withClaimAtGate(async (worker, done) => {
      // Before, the room this claim asked for was offered too: a hand-off and the claim could fill it twice.
      assert.equal(worker.handOffRoom('claims'), 0, 'no room is offered while the claim is out');
      assert.equal(worker.reserveHandOff('claims', 3), null);
      gate.open();
      await done;
      await eventually(() => offersAll(worker), 5000, 'the worker to offer its whole capacity again after the claim');
    });
  });

  it('a claim that fails in the database gives its room back at once: a worker backing off after the error offers room to hand-offs, and the job still runs', async () => {
    // The room offered right after each reported error: a microtask runs once the claim loop's error
    // handling is over, before its back-off sleep (100 ms after a first error) has ended.
    const roomAfterError: (number | null)[] = [];
    const errors: string[] = [];
    const listen = (worker: Worker): void => {
      worker.on('error', (error) => {
        errors.push(error instanceof Error ? error.message : String(error));
        queueMicrotask(() => roomAfterError.push(worker.handOffRoom('claims')));
      });
    };
    // Another session takes the jobs table: the claim, once let through, waits for its lock and is cancelled there.
    const locker = await pool.connect();
    try {
      await withClaimAtGate(async (worker, done) => {
        await locker.query('BEGIN');
        await locker.query(`LOCK TABLE "${schema}".jobs IN ACCESS EXCLUSIVE MODE`);
        gate.open();
        // This test's claims only (its schema is in their text): other test files run beside it on the same server.
        const waitingClaims = async (): Promise<number[]> =>
          (
            await pool.query<{ pid: number }>(
              `SELECT pid FROM pg_stat_activity
                WHERE wait_event_type = 'Lock' AND query ILIKE '%skip locked%' AND strpos(query, $1) > 0 AND pid <> pg_backend_pid()`,
              [`"${schema}".`],
            )
          ).rows.map((r) => r.pid);
        await eventually(async () => (await waitingClaims()).length === 1, 5000, 'the claim to wait for the lock');
        assert.equal(worker.handOffRoom('claims'), 0, 'no room is offered while the claim is out');
        assert.equal(errors.length, 0, errors.join('; '));
        for (const pid of await waitingClaims()) await pool.query('SELECT pg_cancel_backend($1)', [pid]);
        await eventually(() => roomAfterError.length > 0, 5000, 'the cancelled claim to be reported');
        assert.match(errors[0]!, /cancel/i);
        // With the in-flight flag cleared only after a claim that succeeded, this room stays 0 through the back-off.
        assert.equal(roomAfterError[0], worker.capacity, 'the room is offered again during the back-off');
        await locker.query('ROLLBACK');
        await done; // the next claim, after the back-off, took the job
      }, listen);
    } finally {
      await locker.query('ROLLBACK').catch(() => {});
      locker.release();
    }
  });
});

for (const db of testDatabases()) {
  describe(`claims after a keyed job on ${db.name}`, () => {
    it("a finished job with an ordering key lets its key's next job start at once, not at the next poll", async () => {
      const { mailroom } = await db.open();
      const step = defineJob<{ n: number }>('claims.step', { queue: 'keyed-claims' });
      let releaseFirst!: () => void;
      const firstMayEnd = new Promise<void>((resolve) => (releaseFirst = resolve));
      const started: number[] = [];
      const worker = mailroom.worker({
        queues: ['keyed-claims'],
        concurrency: 4,
        pollInterval: '1m',
        handlers: {
          [step.name]: async (job: Job<{ n: number }>) => {
            started.push(job.data.n);
            if (job.data.n === 1) await firstMayEnd;
          },
        },
      });
      await worker.start();
      try {
        const firstStarted = new Promise<void>((resolve) => worker.once('started', () => resolve()));
        await mailroom.enqueue(step, { n: 1 }, { orderingKey: 'account-7' });
        await firstStarted;
        // Enqueued while the first runs: blocked behind it, so its NOTIFY finds nothing claimable and the
        // worker's claim comes back short. Only the first job's completion makes it claimable; the poll is
        // a minute away, so the worker must look again when that completion commits.
        await mailroom.enqueue(step, { n: 2 }, { orderingKey: 'account-7' });
        await new Promise((r) => setTimeout(r, 300)); // the NOTIFY's claim found nothing; the worker sleeps
        assert.deepEqual(started, [1]);
        const second = waitForEvents(worker, 'completed', 2, 10_000);
        releaseFirst();
        await second;
        assert.deepEqual(started, [1, 2]);
      } finally {
        releaseFirst();
        await worker.stop();
      }
    });
  });
}

for (const db of testDatabases()) {
  describe(`jobs handed to a worker that stopped, on ${db.name}`, () => {
    // A broker ingest's hand-off (test/ingest.test.ts) inserts jobs already claimed by the worker and
    // hands them over after its commit; a worker that stopped meanwhile must not lose them.
    it('a stopped worker hands them back to the queue with the attempt not spent; an abandoned one leaves them to lease expiry', async () => {
      const t = await db.open();
      const ran: string[] = [];
      const handedTo = async (stop: (w: ReturnType<typeof t.mailroom.worker>) => Promise<void>) => {
        const worker = t.mailroom.worker({ queues: ['handed'], handlers: { 'claims.handed': async (job: Job) => void ran.push(job.id) } });
        await worker.start();
        let room = worker.reserveHandOff('handed', 1);
        for (let waited = 0; room === null; waited += 10) {
          assert.ok(waited < 10_000, 'the idle worker offered no room in 10 s');
          await new Promise((r) => setTimeout(r, 10)); // until its first claim found the queue empty
          room = worker.reserveHandOff('handed', 1);
        }
        const [row] = await t.sql<ClaimedRow>(
          `INSERT INTO "${t.schema}".jobs AS j (id, queue, type, state, attempt, claim_count, locked_until, locked_by, started_at, max_attempts, payload)
           VALUES (gen_random_uuid(), 'handed', 'claims.handed', 'active', 1, 1, now() + interval '1 minute', $1, now(), 3, '{}')
           RETURNING ${CLAIM_RETURNING}`,
          [room.workerId],
        );
        await stop(worker);
        worker.adopt([row!], room.jobs, 0);
        return row!.id;
      };
      const state = async (id: string) => (await t.sql<{ state: string; attempt: number }>(`SELECT state, attempt FROM "${t.schema}".jobs WHERE id = $1`, [id]))[0]!;
      const given = await handedTo((w) => w.stop());
      for (let waited = 0; (await state(given)).state !== 'available'; waited += 10) {
        assert.ok(waited < 10_000, `not handed back after 10 s: ${JSON.stringify(await state(given))}`);
        await new Promise((r) => setTimeout(r, 10));
      }
      assert.deepEqual(await state(given), { state: 'available', attempt: 0 });
      const left = await handedTo(async (w) => w.abandon());
      await new Promise((r) => setTimeout(r, 200));
      assert.equal((await state(left)).state, 'active', 'a crashed worker writes nothing: the lease runs out and the job is rescued');
      assert.deepEqual(ran, [given], 'the job given back ran once, on the next worker; the one left leased did not run');
    });
  });
}
