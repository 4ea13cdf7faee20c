/**
 * Per-key ordering with followers (guarantee 4): a claim takes the next jobs
 * of a key behind its head, and the worker runs each only after the job
 * before it completed. Failures, snoozes, dead heads, a graceful stop and a
 * crash in the middle of a chain keep each key's order, run no two jobs of a
 * key at once, and spend no attempt of a follower that never ran.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { defineJob, snooze, type Job } from '../src/index.ts';
import { testDatabases } from './helpers/databases.ts';
import { eventually, waitForEvents } from './helpers/events.ts';

type Step = { key: string; seq: number };

/** Records each key's runs and checks that no two jobs of one key run at once. */
function recorder() {
  const log = new Map<string, number[]>();
  const running = new Set<string>();
  let overlap = 0;
  return {
    log,
    get overlap() {
      return overlap;
    },
    enter(step: Step) {
      if (running.has(step.key)) overlap++;
      running.add(step.key);
    },
    leave(step: Step, ran: boolean) {
      running.delete(step.key);
      if (ran) log.set(step.key, [...(log.get(step.key) ?? []), step.seq]);
    },
  };
}

function steps(keys: string[], perKey: number): Step[] {
  return Array.from({ length: perKey }, (_, seq) => keys.map((key) => ({ key, seq }))).flat();
}

for (const db of testDatabases()) {
  describe(`ordering key chains on ${db.name}`, () => {
    it('a claim takes followers behind each head; with retries, snoozes and a dead job in the chains, each key runs in order, one job at a time', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob<Step>('chains.step', { queue: 'chains', retry: { maxAttempts: 3, backoff: { base: 5, max: 10 } } });
      const keys = ['a', 'b', 'c'];
      const perKey = 30;
      await mailroom.enqueueMany(job, steps(keys, perKey), { orderingKey: (d) => d.key });
      const rec = recorder();
      const failedOnce = new Set<string>();
      const snoozedOnce = new Set<string>();
      let activeBehindHead = 0;
      const worker = mailroom.worker({
        queues: ['chains'],
        concurrency: 6,
        prefetch: 30,
        pollInterval: 10,
        handlers: {
          [job.name]: async (j: Job<Step>) => {
            const id = `${j.data.key}/${j.data.seq}`;
            rec.enter(j.data);
            if (j.data.key === 'a' && j.data.seq === 1) {
              // While a head of key a runs, the jobs behind it are already claimed by this worker. (Not the
              // first: a queue's first claim is the plain one, until it has brought a job with a key.)
              const [row] = await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE ordering_key = 'a' AND state = 'active'`);
              activeBehindHead = row!.n;
            }
            await new Promise((r) => setTimeout(r, 1));
            if (j.data.seq % 7 === 3 && !failedOnce.has(id)) {
              failedOnce.add(id);
              rec.leave(j.data, false);
              throw new Error('transient: the rest of the chain goes back and waits');
            }
            if (j.data.seq % 11 === 5 && !snoozedOnce.has(id)) {
              snoozedOnce.add(id);
              rec.leave(j.data, false);
              return snooze(5);
            }
            if (j.data.key === 'c' && j.data.seq === 12) {
              rec.leave(j.data, false);
              throw new Error('permanent: dead, and the key moves on');
            }
            rec.leave(j.data, true);
          },
        },
      });
      const done = waitForEvents(worker, 'completed', keys.length * perKey - 1, 60_000);
      await worker.start();
      await done;
      await worker.stop();
      assert.ok(activeBehindHead > 1, `followers were claimed with the head (active jobs of key a: ${activeBehindHead})`);
      assert.equal(rec.overlap, 0, 'two jobs of one key never ran at once');
      for (const key of keys) {
        const expected = Array.from({ length: perKey }, (_, i) => i).filter((i) => !(key === 'c' && i === 12));
        assert.deepEqual(rec.log.get(key), expected, `order of key ${key}`);
      }
      const [dead] = await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE state = 'dead'`);
      assert.equal(dead!.n, 1);
    });

    it('followers never take a slot from another key: jobs of new keys start while a chain is held', async () => {
      const { mailroom } = await db.open();
      const job = defineJob<Step>('chains.room', { queue: 'chains-room' });
      await mailroom.enqueueMany(job, steps(['a'], 8), { orderingKey: (d) => d.key });
      const started: string[] = [];
      let firstStarted!: () => void;
      const first = new Promise<void>((r) => (firstStarted = r));
      const worker = mailroom.worker({
        queues: ['chains-room'],
        concurrency: 4,
        pollInterval: 20,
        handlers: {
          [job.name]: async (j: Job<Step>) => {
            started.push(`${j.data.key}${j.data.seq}`);
            if (started.length === 1) firstStarted();
            await new Promise((r) => setTimeout(r, 150));
          },
        },
      });
      const done = waitForEvents(worker, 'completed', 11, 20_000);
      await worker.start();
      await first; // key a's head runs, with its followers held by this worker
      await mailroom.enqueueMany(job, ['b', 'c', 'd'].map((key) => ({ key, seq: 0 })), { orderingKey: (d) => d.key });
      await done;
      await worker.stop();
      const before = started.slice(0, started.indexOf('a2'));
      assert.ok(['b0', 'c0', 'd0'].every((id) => before.includes(id)), `keys b, c and d started before a's third job: ${started.join(' ')}`);
    });

    it('a queue with a rate limit claims every job as a head: no follower comes outside its window', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob<Step>('chains.limited', { queue: 'chains-limited' });
      await mailroom.enqueueMany(job, steps(['k'], 4), { orderingKey: (d) => d.key });
      const activeWhileRunning: number[] = [];
      const worker = mailroom.worker({
        queues: ['chains-limited'],
        concurrency: 4,
        pollInterval: 10,
        rateLimit: { max: 100, per: '1s' },
        handlers: {
          [job.name]: async () => {
            const [row] = await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE state = 'active'`);
            activeWhileRunning.push(row!.n);
          },
        },
      });
      const done = waitForEvents(worker, 'completed', 4, 10_000);
      await worker.start();
      await done;
      await worker.stop();
      assert.deepEqual(activeWhileRunning, [1, 1, 1, 1], 'only the running job of the key was claimed');
    });

    it('a chain stops at the first job of the key that is not due: a later job never overtakes a delayed one', async () => {
      const { mailroom } = await db.open();
      const job = defineJob<Step>('chains.delay', { queue: 'chains-delay' });
      await mailroom.enqueue(job, { key: 'k', seq: 0 }, { orderingKey: 'k' });
      const delayed = Date.now() + 400;
      await mailroom.enqueue(job, { key: 'k', seq: 1 }, { orderingKey: 'k', runAt: new Date(delayed) });
      await mailroom.enqueue(job, { key: 'k', seq: 2 }, { orderingKey: 'k' });
      const ran: { seq: number; at: number }[] = [];
      const worker = mailroom.worker({ queues: ['chains-delay'], concurrency: 5, pollInterval: 20, handlers: { [job.name]: (j: Job<Step>) => void ran.push({ seq: j.data.seq, at: Date.now() }) } });
      const done = waitForEvents(worker, 'completed', 3, 10_000);
      await worker.start();
      await done;
      await worker.stop();
      assert.deepEqual(ran.map((r) => r.seq), [0, 1, 2]);
      assert.ok(ran[1]!.at >= delayed - 50, 'the delayed job did not run before its time');
    });

    it('a dead head with ordering.onDead = hold hands its followers back, and they stay blocked', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob<Step>('chains.hold', { queue: 'chains-hold', retry: { maxAttempts: 1 }, ordering: { onDead: 'hold' } });
      await mailroom.enqueueMany(job, steps(['k'], 6), { orderingKey: (d) => d.key });
      const ran: number[] = [];
      const worker = mailroom.worker({
        queues: ['chains-hold'],
        concurrency: 4,
        pollInterval: 10,
        handlers: {
          [job.name]: (j: Job<Step>) => {
            ran.push(j.data.seq);
            if (j.data.seq === 1) throw new Error('poison');
          },
        },
      });
      const failed = waitForEvents(worker, 'failed', 1);
      await worker.start();
      await failed;
      await new Promise((r) => setTimeout(r, 200));
      await worker.stop();
      assert.deepEqual(ran, [0, 1], 'nothing behind the dead job ran');
      const rows = await sql<{ seq: number; state: string; blocked: boolean; attempt: number }>(
        `SELECT (payload->>'seq')::int AS seq, state, blocked, attempt FROM "${schema}".jobs ORDER BY ordering_seq`,
      );
      assert.deepEqual(rows, [
        { seq: 0, state: 'completed', blocked: false, attempt: 1 },
        { seq: 1, state: 'dead', blocked: false, attempt: 1 },
        ...[2, 3, 4, 5].map((seq) => ({ seq, state: 'available', blocked: true, attempt: 0 })),
      ]);
    });

    it('a graceful stop hands the followers back unspent, and the next worker runs the key on in order', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob<Step>('chains.stop', { queue: 'chains-stop' });
      await mailroom.enqueueMany(job, steps(['k'], 10), { orderingKey: (d) => d.key });
      const ran: number[] = [];
      let release!: () => void;
      const gate = new Promise<void>((r) => (release = r));
      const first = mailroom.worker({
        queues: ['chains-stop'],
        concurrency: 5,
        pollInterval: 10,
        handlers: {
          [job.name]: async (j: Job<Step>) => {
            ran.push(j.data.seq);
            if (j.data.seq === 1) await gate;
          },
        },
      });
      await first.start();
      await eventually(() => ran.length === 2, 10_000, 'the second job runs');
      const [held] = await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE state = 'active'`);
      assert.ok(held!.n > 1, `the worker holds followers behind the running job (${held!.n} active)`);
      const stopping = first.stop({ timeout: '5s' });
      release();
      await stopping;
      const back = await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE state = 'available' AND attempt > 0`);
      assert.equal(back[0]!.n, 0, 'no follower handed back spent an attempt');
      const second = mailroom.worker({ queues: ['chains-stop'], concurrency: 5, pollInterval: 10, handlers: { [job.name]: (j: Job<Step>) => void ran.push(j.data.seq) } });
      const rest = 10 - (await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE state = 'completed'`))[0]!.n;
      const done = waitForEvents(second, 'completed', rest, 20_000);
      await second.start();
      await done;
      await second.stop();
      assert.deepEqual(ran, Array.from({ length: 10 }, (_, i) => i), 'each job ran once, in order');
    });

    it('a held head whose lease was lost hands its followers back, and the key runs on in order', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob<Step>('chains.lost', { queue: 'chains-lost' });
      const ran: string[] = [];
      let open!: () => void;
      const gate = new Promise<void>((r) => (open = r));
      const worker = mailroom.worker({
        queues: ['chains-lost'],
        concurrency: 1,
        prefetch: 5,
        lease: 300, // a heartbeat every 100 ms
        maintenance: false,
        pollInterval: 20,
        handlers: {
          [job.name]: async (j: Job<Step>) => {
            ran.push(`${j.data.key}${j.data.seq}`);
            if (j.data.key === 'b') await gate; // holds the only slot
          },
        },
      });
      const first = waitForEvents(worker, 'completed', 1);
      await mailroom.enqueue(job, { key: 'x', seq: 0 }, { orderingKey: 'x' }); // the queue has keys from now on
      await worker.start();
      await first;
      await mailroom.enqueue(job, { key: 'b', seq: 0 });
      const ids = await mailroom.enqueueMany(job, steps(['k'], 3), { orderingKey: 'k' });
      await eventually(async () => (await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE ordering_key = 'k' AND state = 'active'`))[0]!.n === 3, 10_000, 'k0 held with its two followers');
      // k0 waits for the slot; its lease runs out (as if this worker had stalled) and it is rescued.
      // (A heartbeat may renew the lease between the two statements: then again.)
      await eventually(async () => {
        await sql(`UPDATE "${schema}".jobs SET locked_until = now() - interval '1 second' WHERE id = $1 AND state = 'active'`, [ids[0]]);
        return (await mailroom.maintain()).rescued === 1;
      }, 10_000, 'k0 rescued');
      // Handed back (waiting again), or already claimed again behind k0's new claim: not held by the stale chain.
      await eventually(async () => {
        const rows = await sql<{ state: string; claim_count: number }>(`SELECT state, claim_count FROM "${schema}".jobs WHERE id = ANY($1::uuid[])`, [ids.slice(1)]);
        return rows.every((r) => r.state === 'available' || r.claim_count > 1);
      }, 10_000, 'the followers of the lost head handed back');
      const done = waitForEvents(worker, 'completed', 4, 20_000);
      open();
      await done;
      await worker.stop();
      assert.deepEqual(ran, ['x0', 'b0', 'k0', 'k1', 'k2']);
    });

    it('a crashed worker\'s followers come back behind the head without spending an attempt, and run in order', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob<Step>('chains.crash', { queue: 'chains-crash', retry: { maxAttempts: 1 } });
      await mailroom.enqueueMany(job, steps(['k'], 8), { orderingKey: (d) => d.key });
      const ran: number[] = [];
      const crashing = mailroom.worker({
        queues: ['chains-crash'],
        concurrency: 4,
        lease: 150,
        maintenance: false,
        handlers: {
          [job.name]: (j: Job<Step>) => {
            ran.push(j.data.seq);
            return j.data.seq === 2 ? new Promise<void>(() => {}) : undefined; // hangs: then the process "crashes"
          },
        },
      });
      await crashing.start();
      await eventually(() => ran.length === 3, 10_000, 'the third job runs');
      crashing.abandon();
      // Followers claimed later (a chain taking more behind its tail) have later leases: wait for every one.
      await eventually(async () => {
        await mailroom.maintain();
        return (await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE state = 'active'`))[0]!.n === 0;
      }, 10_000, 'rescue');
      const rows = await sql<{ seq: number; state: string; blocked: boolean; attempt: number }>(
        `SELECT (payload->>'seq')::int AS seq, state, blocked, attempt FROM "${schema}".jobs WHERE state <> 'completed' ORDER BY ordering_seq`,
      );
      // Job 2 ran and spent its only attempt; the followers behind it never ran and spent none.
      assert.deepEqual(rows[0], { seq: 2, state: 'dead', blocked: false, attempt: 1 });
      for (const row of rows.slice(1)) assert.equal(row.attempt, 0, `follower ${row.seq} spent no attempt: ${JSON.stringify(rows)}`);
      assert.ok(rows.slice(1).every((r) => r.state === 'available'), 'the followers wait again');
      const fresh = mailroom.worker({ queues: ['chains-crash'], concurrency: 4, pollInterval: 10, handlers: { [job.name]: (j: Job<Step>) => void ran.push(j.data.seq) } });
      const done = waitForEvents(fresh, 'completed', 5, 20_000);
      await fresh.start();
      await done;
      await fresh.stop();
      assert.deepEqual(ran, [0, 1, 2, 3, 4, 5, 6, 7], 'the key went on in order once job 2 was dead-lettered');
    });
  });
}
