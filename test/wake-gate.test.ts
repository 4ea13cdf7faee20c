/**
 * Publishers send NOTIFY only while a relay sleeps (src/storage/wake-gate.ts):
 * PostgreSQL commits notifying transactions one at a time, so a NOTIFY per
 * publish caps concurrent publishers. These tests count the notifications a
 * real database delivers, and check that a sleeping relay is still woken at
 * once, including by a transaction that checked before the relay said it sleeps.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import type { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { defineEvent, defineJob, type Job, type RelayTarget } from '../src/index.ts';
import { testDatabases, type TestDatabase, type TestMailroom } from './helpers/databases.ts';
import { connect } from '../src/storage/connect.ts';
import { quoteSchema } from '../src/identifiers.ts';
import { BUSY_NOTIFIES, FAST_POLL_MS, QUIET_MS, WakeGate, wakeGateQueries } from '../src/storage/wake-gate.ts';
import { eventually } from './helpers/events.ts';

const noted = defineEvent<{ n: number }>('wake.noted', { version: 1 });
const chore = defineJob<{ n: number }>('wake.chore', { queue: 'chores' });

/**
 * Counts the NOTIFYs on one of the mailroom's channels (`outbox` or `wakeup`) until `stop()`; with
 * `payload`, only those carrying it. `since(ms)` counts those that arrived at or after `Date.now()` = ms.
 */
async function countNotifications(
  db: TestDatabase,
  schema: string,
  which: 'outbox' | 'wakeup' = 'outbox',
  payload?: string,
): Promise<{ count(): number; since(ms: number): number; stop(): Promise<void> }> {
  const arrivals: number[] = [];
  const channel = `${schema}_${which}`;
  const heard = (got: string | undefined) => {
    if (payload === undefined || got === payload) arrivals.push(Date.now());
  };
  const counts = { count: () => arrivals.length, since: (ms: number) => arrivals.filter((at) => at >= ms).length };
  const handle = await db.handle();
  if (db.name === 'pglite') {
    const unlisten = await (handle as PGlite).listen(channel, heard);
    return { ...counts, stop: unlisten };
  }
  const client = await (handle as pg.Pool).connect();
  client.on('notification', (n) => n.channel === channel && heard(n.payload));
  await client.query(`LISTEN "${channel}"`);
  return {
    ...counts,
    stop: async () => {
      await client.query(`UNLISTEN "${channel}"`);
      client.release();
    },
  };
}

function sink(): RelayTarget & { ns: number[] } {
  const ns: number[] = [];
  return {
    name: 'sink',
    ns,
    publish: async (events) => {
      for (const e of events) ns.push((e.envelope.data as { n: number }).n);
    },
  };
}

async function listeners(t: TestMailroom, channel = 'outbox'): Promise<string[]> {
  const rows = await t.sql<{ listener: string }>(`SELECT listener FROM "${t.schema}".wake_listeners WHERE channel = $1`, [channel]);
  return rows.map((r) => r.listener);
}

/**
 * 10 callers, one write each per transaction, from now until a second and at least 200 writes after
 * `from` resolved (a loaded machine made 76 in a second), at most 15 s in all. Returns how many
 * writes were made, and how many of them started after `from`.
 */
async function secondOfCallers(write: (n: number) => Promise<unknown>, from: Promise<number>): Promise<{ n: number; after: number }> {
  let n = 0;
  let after = 0;
  let fromAt: number | undefined;
  void from.then((at) => (fromAt = at), () => undefined);
  const started = Date.now();
  const going = () => (fromAt === undefined || Date.now() < fromAt + 1000 || after < 200) && Date.now() < started + 15_000;
  await Promise.all(
    Array.from({ length: 10 }, async () => {
      while (going()) {
        if (fromAt !== undefined) after++;
        await write(++n);
      }
    }),
  );
  await from; // its failure is the test's
  return { n, after };
}

/** Waits until `id` has recorded itself on `channel`, and past its look-again after recording. */
async function asleep(t: TestMailroom, id: string, channel = 'outbox'): Promise<void> {
  await eventually(async () => (await listeners(t, channel)).includes(id), 10_000, `${id} recorded on ${channel}`);
  await new Promise((r) => setTimeout(r, 300));
}

/** A relay to a sink (poll 1 minute), asleep, on a fresh schema of `db`, and the shared pool for transactions held beside it. */
async function sleepingRelay(db: TestDatabase, options: { poolSize?: number } = {}) {
  const t = await db.open(options);
  const pool = (await db.handle()) as pg.Pool;
  const target = sink();
  const relay = t.mailroom.relay({ internal: false, to: [target], pollInterval: '1m' });
  await relay.start();
  await asleep(t, relay.id);
  return { t, pool, target, relay };
}

/**
 * Runs `fn` while the listener gets notifications with the payload `noise` in bursts of 60 every 20 ms
 * (past {@link BUSY_NOTIFIES} within 100 ms in each burst). `fn` gets the time at which the listener
 * was seen to have stopped asking (its row gone from `wake_listeners`).
 *
 * How fast a machine commits publishing transactions under the NOTIFY lock varies (411 a second in
 * one loaded CI run, 211 in another, below the gate's 500), so the busy tests keep the gate tripped
 * this way, and count only the notifications of the publishes' triggers (another payload) that came
 * after the trip: before it, every publish notifies, as it should while the listener sleeps (one
 * loaded CI run took long enough to trip for 149 of 200 enqueues to notify). The bursts come from a
 * procedure in the server, one transaction per notification: clients sending them one round trip at
 * a time fell below 500 a second on a machine that loaded.
 */
async function whileNotified<T>(
  db: TestDatabase,
  t: TestMailroom,
  which: 'outbox' | 'wakeup',
  listener: { id: string; channel: string },
  fn: (tripped: Promise<number>) => Promise<T>,
): Promise<T> {
  const pool = (await db.handle()) as pg.Pool;
  const s = `"${t.schema}"`;
  await pool.query(`CREATE TABLE ${s}.noise_stop (stop boolean)`);
  await pool.query(
    `CREATE PROCEDURE ${s}.notify_bursts(channel text) LANGUAGE plpgsql AS $$
     BEGIN
       LOOP
         EXIT WHEN EXISTS (SELECT 1 FROM ${s}.noise_stop);
         FOR i IN 1..60 LOOP
           PERFORM pg_notify(channel, 'noise');
           COMMIT;
         END LOOP;
         PERFORM pg_sleep(0.02);
       END LOOP;
     END $$`,
  );
  const noise = pool.query(`CALL ${s}.notify_bursts($1)`, [`${t.schema}_${which}`]);
  try {
    const tripped = (async () => {
      await eventually(async () => !(await listeners(t, listener.channel)).includes(listener.id), 10_000, `${listener.id} to stop asking on ${listener.channel}`);
      return Date.now();
    })();
    return await fn(tripped);
  } finally {
    await pool.query(`INSERT INTO ${s}.noise_stop VALUES (true)`);
    await noise.catch(() => undefined);
  }
}

for (const db of testDatabases()) {
  describe(`wake gate on ${db.name}`, () => {
    it('the gate itself: recorded when idle, gone after 50 notifications within 100 ms, polling while work comes, recorded again once quiet, gone on close', async () => {
      const t = await db.open();
      const driver = await connect(await db.handle(), 4);
      const errors: unknown[] = [];
      const gate = new WakeGate(driver, wakeGateQueries(quoteSchema(t.schema)), ['queue:g'], 'gate-test', 1000, (e) => void errors.push(e));
      try {
        assert.equal(await gate.idle(), FAST_POLL_MS, 'just recorded: look again soon');
        assert.deepEqual(await listeners(t, 'queue:g'), ['gate-test']);
        await eventually(async () => (await gate.idle()) === 1000, 5_000, 'settled: sleep until the poll');
        for (let i = 1; i < BUSY_NOTIFIES; i++) gate.notified();
        await new Promise((r) => setTimeout(r, 20));
        assert.deepEqual(await listeners(t, 'queue:g'), ['gate-test'], `${BUSY_NOTIFIES - 1} notifications: still recorded`);
        // The window is 100 ms of wall time, which the query above may have used up on a loaded machine: a fresh burst.
        for (let i = 0; i < BUSY_NOTIFIES; i++) gate.notified();
        await eventually(async () => (await listeners(t, 'queue:g')).length === 0, 5_000, 'the row taken away');
        gate.worked();
        assert.equal(await gate.idle(), FAST_POLL_MS, 'polling while work comes');
        assert.equal(gate.capped(200), FAST_POLL_MS, 'a chosen wait is cut while polling');
        await new Promise((r) => setTimeout(r, QUIET_MS + 20));
        assert.equal(gate.capped(200), 200, 'quiet: a chosen wait is left alone');
        assert.equal(await gate.idle(), FAST_POLL_MS, 'quiet: recorded again, look again soon');
        assert.deepEqual(await listeners(t, 'queue:g'), ['gate-test']);
        await gate.close();
        assert.deepEqual(await listeners(t, 'queue:g'), [], 'closed: gone');
        assert.deepEqual(errors, []);
      } finally {
        await driver.close();
      }
    });

    it(
      'a listener looks once more after the transactions that may have missed its row ended, however late in its looks they commit',
      { skip: db.name === 'pglite' ? 'PGlite serves one connection: no transaction runs beside the gate' : false },
      async () => {
        const t = await db.open();
        const driver = await connect(await db.handle(), 4);
        const client = await ((await db.handle()) as pg.Pool).connect();
        const errors: unknown[] = [];
        const gate = new WakeGate(driver, wakeGateQueries(quoteSchema(t.schema)), ['queue:g'], 'settler', 60_000, (e) => void errors.push(e));
        try {
          await client.query('BEGIN');
          await client.query('SELECT pg_current_xact_id()'); // running, with an xid, when the gate records itself
          assert.equal(await gate.idle(), FAST_POLL_MS, 'just recorded: look again soon');
          const waiting = await gate.idle();
          assert.ok(waiting >= FAST_POLL_MS && waiting <= 200, `that transaction still runs: look again within 200 ms (${waiting})`);
          // It commits between the listener's look and its next check: what it wrote has not been seen yet.
          await client.query('COMMIT');
          // Other test files' transactions on the same server may be in the snapshot too: look again, as a
          // listener would, until they have ended (CI failed once on a short look here: 20 ms, not 5).
          const deadline = Date.now() + 10_000;
          let next = await gate.idle();
          while (next > FAST_POLL_MS && next <= 200 && Date.now() < deadline) {
            await new Promise((r) => setTimeout(r, next));
            next = await gate.idle();
          }
          assert.equal(next, FAST_POLL_MS, 'settled: one more look, for what it committed');
          assert.equal(await gate.idle(), 60_000, 'then sleep until the poll');
          assert.deepEqual(errors, []);
        } finally {
          client.release();
          await gate.close();
          await driver.close();
        }
      },
    );

    it("a sleeping listener refreshes its row before others would take it for a crashed one's; rows of listeners gone for 10 minutes are dropped, on every channel", async () => {
      const t = await db.open();
      const driver = await connect(await db.handle(), 4);
      const errors: unknown[] = [];
      const table = `"${t.schema}".wake_listeners`;
      const ageOf = async (listener: string) =>
        (await t.sql<{ age: number }>(`SELECT extract(epoch FROM now() - seen_at)::float8 AS age FROM ${table} WHERE listener = $1`, [listener]))[0]?.age;
      // A listener that crashed 11 minutes ago, one last seen 5 minutes ago, and one on another channel.
      await t.sql(
        `INSERT INTO ${table} (channel, listener, seen_at) VALUES ('queue:g', 'crashed', now() - interval '11 minutes'),
           ('queue:g', 'quiet', now() - interval '5 minutes'), ('queue:other', 'elsewhere', now() - interval '11 minutes')`,
      );
      const gate = new WakeGate(driver, wakeGateQueries(quoteSchema(t.schema)), ['queue:g'], 'sleeper', 3_600_000, (e) => void errors.push(e), 300);
      try {
        assert.equal(await gate.idle(), FAST_POLL_MS);
        assert.deepEqual((await listeners(t, 'queue:g')).sort(), ['quiet', 'sleeper'], 'the row 11 minutes old is dropped, the one 5 minutes old kept');
        assert.deepEqual(await listeners(t, 'queue:other'), [], "a stale row on another channel goes too (its queue's only worker may be the one that crashed)");
        await eventually(async () => (await gate.idle()) === 300, 5_000, "settled: an hour's poll is cut to the refresh interval");
        // Made to look nine minutes old, as after nine minutes asleep; the next wake-up past the interval refreshes it.
        await t.sql(`UPDATE ${table} SET seen_at = now() - interval '9 minutes' WHERE listener = 'sleeper'`);
        assert.equal(await gate.idle(), 300, 'within the interval: no refresh yet');
        assert.ok((await ageOf('sleeper'))! > 500, 'not refreshed within the interval');
        await new Promise((r) => setTimeout(r, 350));
        assert.equal(await gate.idle(), FAST_POLL_MS, 'past the interval: recorded again, look again soon');
        assert.ok((await ageOf('sleeper'))! < 60, 'refreshed');
        await gate.close();
        assert.deepEqual(errors, []);
      } finally {
        await driver.close();
      }
    });

    it('no NOTIFY while no relay sleeps; a sleeping relay is recorded, notified and woken long before its poll, and leaves on stop', async () => {
      const t = await db.open();
      const notes = await countNotifications(db, t.schema);
      try {
        for (let n = 1; n <= 5; n++) await t.mailroom.publish(noted, { n });
        await new Promise((r) => setTimeout(r, 100)); // notifications arrive after the commit
        assert.equal(notes.count(), 0, 'nobody sleeps: five publishes sent no NOTIFY');

        const target = sink();
        const relay = t.mailroom.relay({ internal: false, to: [target], pollInterval: '1m' });
        await relay.start();
        await eventually(() => target.ns.length === 5, 10_000, 'the first five delivered');
        await asleep(t, relay.id);
        const started = Date.now();
        await t.mailroom.publish(noted, { n: 6 });
        await eventually(() => target.ns.length === 6, 10_000, 'the sixth delivered');
        assert.ok(Date.now() - started < 10_000, 'woken, not polled (the poll is a minute)');
        // The counting connection hears the NOTIFY on its own schedule: on a busy machine after the relay delivered.
        await eventually(() => notes.count() >= 1, 5_000, 'the publish notified the sleeping relay');
        await relay.stop();
        assert.deepEqual(await listeners(t), [], 'a stopped relay is not asked for');
      } finally {
        await notes.stop();
      }
    });

    it(
      'a transaction that published before the relay said it sleeps, and commits after, is delivered without the poll',
      { skip: db.name === 'pglite' ? 'PGlite serves one connection: the relay cannot run beside an open transaction' : false },
      async () => {
        const t = await db.open();
        const client = await ((await db.handle()) as pg.Pool).connect();
        const target = sink();
        const relay = t.mailroom.relay({ internal: false, to: [target], pollInterval: '1m' });
        try {
          await client.query('BEGIN');
          await t.mailroom.publish(noted, { n: 1 }, { tx: client }); // the trigger saw no listener: no NOTIFY at commit
          await relay.start();
          await asleep(t, relay.id);
          await client.query('COMMIT');
          const committed = Date.now();
          await eventually(() => target.ns.length === 1, 10_000, 'the event of the straddling transaction delivered');
          assert.ok(Date.now() - committed < 10_000, 'looked again while that transaction ran, instead of sleeping a minute');
        } finally {
          client.release();
          await relay.stop();
        }
      },
    );

    it(
      'a relay held back round after round while it delivers looks again soon once the holder commits, not after a doubled wait',
      { skip: db.name === 'pglite' ? 'PGlite serves one connection: no transaction held open beside the relay' : false },
      async () => {
        const { t, pool, target, relay } = await sleepingRelay(db);
        let holder: pg.PoolClient | undefined;
        try {
          // Each step: a transaction holds the fence with an event of its own; an event committed after it waits
          // behind that fence; then the step before's holder commits. Every round then delivers and ends held back:
          // at every instant some committed event waits behind an open transaction, so no round finds the outbox
          // idle (an idle relay would sleep until a NOTIFY, and none comes here).
          // After the first step no publish notifies (the relay's rows taken away, as while it polls fast):
          // only the relay's own held-back wait brings it back.
          const STEPS = 9;
          for (let k = 0; k < STEPS; k++) {
            const next = await pool.connect();
            await next.query('BEGIN');
            await t.mailroom.publish(noted, { n: 1000 + k }, { tx: next });
            await t.mailroom.publish(noted, { n: k });
            if (k === 0) await t.sql(`DELETE FROM "${t.schema}".wake_listeners`);
            if (holder) {
              await holder.query('COMMIT');
              holder.release();
            }
            holder = next;
            await eventually(() => target.ns.includes(1000 + k - 1) || k === 0, 20_000, `step ${k} delivered`);
          }
          await new Promise((r) => setTimeout(r, 200)); // the relay's held-back wait is running
          const committed = Date.now();
          await holder!.query('COMMIT');
          holder!.release();
          holder = undefined;
          await eventually(() => target.ns.includes(STEPS - 1), 10_000, 'the last event delivered');
          // Doubling across rounds that delivered reached seconds here (50 ms x 2^k).
          assert.ok(Date.now() - committed < 1500, `delivered ${Date.now() - committed} ms after the holder committed`);
        } finally {
          await holder?.query('ROLLBACK').catch(() => {});
          holder?.release();
          await relay.stop();
        }
      },
    );

    it(
      'a relay held back just as it polls fast backs off from its short waits, not to the poll: it delivers soon after the holder commits',
      { skip: db.name === 'pglite' ? 'PGlite serves one connection: no transaction held open beside the relay' : false },
      async () => {
        const { t, pool, target, relay } = await sleepingRelay(db, { poolSize: 12 });
        let publishing = true;
        let n = 0;
        // One publisher, an event per transaction, from before the trip until the fence is held below: the relay
        // works all along, so it keeps polling fast (no row in wake_listeners, so no publish notifies it).
        const publisher = (async () => {
          while (publishing) await t.mailroom.publish(noted, { n: ++n });
        })();
        const holder = await pool.connect();
        try {
          await whileNotified(db, t, 'outbox', { id: relay.id, channel: 'outbox' }, (tripped) => tripped);
          await eventually(() => target.ns.length > 0 && target.ns.length >= n - 5, 10_000, 'the relay keeping up');
          // Hold the fence with a transaction that publishes nothing (its commit notifies nobody), and commit an event behind it.
          await holder.query('BEGIN');
          await holder.query('SELECT pg_current_xact_id()');
          publishing = false;
          await publisher;
          await t.mailroom.publish(noted, { n: -1 });
          // Past QUIET_MS: the wait is no longer cut to FAST_POLL_MS. Doubled on every cut round, it had reached the poll (1 minute).
          await new Promise((r) => setTimeout(r, QUIET_MS + 400));
          const committed = Date.now();
          await holder.query('COMMIT');
          await eventually(() => target.ns.includes(-1), 10_000, 'the held-back event delivered');
          assert.ok(Date.now() - committed < 2000, `delivered ${Date.now() - committed} ms after the holder committed`);
        } finally {
          publishing = false;
          await publisher.catch(() => {});
          await holder.query('ROLLBACK').catch(() => {});
          holder.release();
          await relay.stop();
        }
      },
    );
    it(
      'a relay held back for seconds with a long poll looks again at least every second: it delivers within about a second of the holder commit',
      { skip: db.name === 'pglite' ? 'PGlite serves one connection: no transaction held open beside the relay' : false },
      async () => {
        const { t, pool, target, relay } = await sleepingRelay(db, { poolSize: 12 });
        const holder = await pool.connect();
        try {
          // Another application's long transaction (it has an xid, publishes nothing, and its commit notifies nobody).
          await holder.query('BEGIN');
          await holder.query('SELECT pg_current_xact_id()');
          await t.mailroom.publish(noted, { n: -2 });
          // Doubled from 50 ms on every round that delivers nothing, the relay's waits would sum to 3.15 s and the
          // next one last 3.2 s: held 4 s, the event would come about 2.3 s after the commit.
          await new Promise((r) => setTimeout(r, 4000));
          assert.equal(target.ns.length, 0, 'nothing delivered while the fence is held');
          const committed = Date.now();
          await holder.query('COMMIT');
          await eventually(() => target.ns.includes(-2), 10_000, 'the held-back event delivered');
          const after = Date.now() - committed;
          assert.ok(after < 1500, `delivered ${after} ms after the holder committed`);
        } finally {
          await holder.query('ROLLBACK').catch(() => {});
          holder.release();
          await relay.stop();
        }
      },
    );
    it(
      'a relay notified fast stops asking for NOTIFY, polls while events come, and asks again once they stop',
      { skip: db.name === 'pglite' ? 'PGlite serves one connection: no concurrent publishers' : false },
      async () => {
        const t = await db.open({ poolSize: 12 });
        const target = sink();
        const relay = t.mailroom.relay({ internal: false, to: [target], pollInterval: '1m' });
        await relay.start();
        await asleep(t, relay.id);
        const notes = await countNotifications(db, t.schema, 'outbox', '');
        try {
          // 10 publishers, one event per transaction, for about a second after the trip: the relay finds events every few ms and keeps polling.
          const { n, after, trippedAt } = await whileNotified(db, t, 'outbox', { id: relay.id, channel: 'outbox' }, async (tripped) => ({
            ...(await secondOfCallers((k) => t.mailroom.publish(noted, { n: k }), tripped)),
            trippedAt: await tripped,
          }));
          await eventually(() => target.ns.length === n, 10_000, `all ${n} delivered`);
          await new Promise((r) => setTimeout(r, 100));
          const fromPublishes = notes.since(trippedAt);
          assert.ok(after >= 200, `enough transactions to measure (${after})`);
          assert.ok(fromPublishes < after / 4, `${fromPublishes} notifications from ${after} publishing transactions: the relay, notified fast, did not ask for them`);
          await asleep(t, relay.id);
          const before = notes.count();
          const started = Date.now();
          await t.mailroom.publish(noted, { n: n + 1 });
          await eventually(() => target.ns.length === n + 1, 10_000, 'the quiet publish delivered');
          assert.ok(Date.now() - started < 10_000);
          await eventually(() => notes.count() > before, 5_000, 'the quiet publish notified');
        } finally {
          await notes.stop();
          await relay.stop();
        }
      },
    );
    it('workers: no NOTIFY while no worker of the queue sleeps; a sleeping worker is recorded per queue, woken long before its poll, and leaves on stop', async () => {
      const t = await db.open();
      const notes = await countNotifications(db, t.schema, 'wakeup');
      try {
        for (let n = 1; n <= 5; n++) await t.mailroom.enqueue(chore, { n });
        await new Promise((r) => setTimeout(r, 100));
        assert.equal(notes.count(), 0, 'nobody sleeps: five enqueues sent no NOTIFY');
        const ran: number[] = [];
        const worker = t.mailroom.worker({ queues: ['chores'], pollInterval: '1h', handlers: { [chore.name]: (job: Job<{ n: number }>) => void ran.push(job.data.n) } });
        await worker.start();
        await eventually(() => ran.length === 5, 10_000, 'the first five ran');
        await asleep(t, worker.id, 'queue:chores');
        await t.mailroom.enqueue(chore, { n: 6 });
        await eventually(() => ran.length === 6, 10_000, 'the sixth ran (the poll is an hour)');
        await eventually(() => notes.count() >= 1, 5_000, 'the enqueue notified the sleeping worker');
        await worker.stop();
        assert.deepEqual(await listeners(t, 'queue:chores'), [], 'a stopped worker is not asked for');
      } finally {
        await notes.stop();
      }
    });

    it(
      'workers: a job enqueued before the worker said it sleeps, committed after, runs without the poll',
      { skip: db.name === 'pglite' ? 'PGlite serves one connection: the worker cannot run beside an open transaction' : false },
      async () => {
        const t = await db.open();
        const client = await ((await db.handle()) as pg.Pool).connect();
        const ran: number[] = [];
        const worker = t.mailroom.worker({ queues: ['chores'], pollInterval: '1h', handlers: { [chore.name]: (job: Job<{ n: number }>) => void ran.push(job.data.n) } });
        try {
          await client.query('BEGIN');
          await t.mailroom.enqueue(chore, { n: 1 }, { tx: client });
          await worker.start();
          await asleep(t, worker.id, 'queue:chores');
          await client.query('COMMIT');
          await eventually(() => ran.length === 1, 10_000, 'the job of the straddling transaction ran');
        } finally {
          client.release();
          await worker.stop();
        }
      },
    );

    it(
      'workers: a worker notified fast stops asking, keeps claiming while jobs come, and asks again once they stop',
      { skip: db.name === 'pglite' ? 'PGlite serves one connection: no concurrent enqueuers' : false },
      async () => {
        const t = await db.open({ poolSize: 12 });
        let ran = 0;
        // It also serves the queue `noise`, whose notifications (see whileNotified) keep its gate tripped.
        const worker = t.mailroom.worker({ queues: ['chores', 'noise'], concurrency: 20, pollInterval: '1h', handlers: { [chore.name]: () => void ran++ } });
        await worker.start();
        await asleep(t, worker.id, 'queue:chores');
        const notes = await countNotifications(db, t.schema, 'wakeup', 'chores');
        try {
          const { n, after, trippedAt } = await whileNotified(db, t, 'wakeup', { id: worker.id, channel: 'queue:chores' }, async (tripped) => ({
            ...(await secondOfCallers((k) => t.mailroom.enqueue(chore, { n: k }), tripped)),
            trippedAt: await tripped,
          }));
          await eventually(() => ran === n, 10_000, `all ${n} ran`);
          await new Promise((r) => setTimeout(r, 100));
          const fromEnqueues = notes.since(trippedAt);
          assert.ok(after >= 200, `enough transactions to measure (${after})`);
          assert.ok(fromEnqueues < after / 4, `${fromEnqueues} notifications from ${after} enqueueing transactions: the worker, notified fast, did not ask for them`);
          await asleep(t, worker.id, 'queue:chores');
          await t.mailroom.enqueue(chore, { n: n + 1 });
          await eventually(() => ran === n + 1, 10_000, 'the quiet enqueue ran (the poll is an hour)');
        } finally {
          await notes.stop();
          await worker.stop();
        }
      },
    );
  });
}
