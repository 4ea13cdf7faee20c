/**
 * Stopping waits for the background passes in flight (PostgreSQL, with
 * TEST_DATABASE_URL): a worker's maintenance pass and a consumer group's inbox
 * prune, each held up by a table lock taken from outside, must end before
 * `stop()` resolves, so that `mailroom.close()` ending the pool right after
 * cuts no pass off (it used to report "Cannot use a pool after calling end on
 * the pool" and leave the pass half done). A pass still blocked when the
 * stop's timeout is spent has its statement cancelled: the stop resolves, the
 * pass's batch rolls back and an error names the pass.
 */
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { createMailroom, defineEvent, defineJob, type Mailroom, type Relay, type RelayTarget } from '../src/index.ts';
import { databaseUrl, testDatabases, uniqueSchema } from './helpers/databases.ts';
import { scriptedSource } from './helpers/scripted-source.ts';

const HELD_MS = 400;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A mailroom on its own pool (closing it ends the pool), in a fresh schema; its reported errors in `errors`. */
const mailrooms: Mailroom[] = [];
async function openOwn(options: Parameters<typeof createMailroom>[0]): Promise<{ mailroom: Mailroom; schema: string; errors: unknown[] }> {
  const schema = uniqueSchema('shutdown');
  const mailroom = await createMailroom({ ...options, database: databaseUrl, schema });
  mailrooms.push(mailroom);
  await mailroom.migrate();
  const errors: unknown[] = [];
  mailroom.on('error', ({ error }) => void errors.push(error));
  return { mailroom, schema, errors };
}

/**
 * Waits until a backend waits for a lock on `table` of `schema` (during a statement, or while it
 * prepares one); with `statement`, one whose statement begins so (another may wait there too).
 */
async function blockedOn(client: pg.Client, schema: string, table: string, ms: number, statement = ''): Promise<void> {
  const deadline = Date.now() + ms;
  for (;;) {
    // `client` may be in a transaction, where pg_stat_activity would read the same snapshot each time.
    await client.query('SELECT pg_stat_clear_snapshot()');
    const { rows } = await client.query(
      `SELECT count(*)::int AS n FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
        WHERE NOT l.granted AND l.relation = $1::regclass AND a.query LIKE $2`,
      [`"${schema}".${table}`, `${statement}%`],
    );
    if (rows[0].n > 0) return;
    assert.ok(Date.now() < deadline, `nothing waited for the lock on ${table}${statement ? ` in a ${statement}` : ''} within ${ms} ms`);
    await sleep(25);
  }
}

/** Takes `table` in `mode` (default ACCESS EXCLUSIVE) in a transaction left open; the returned function commits it. */
async function lockTable(schema: string, table: string, mode = 'ACCESS EXCLUSIVE'): Promise<{ client: pg.Client; release: () => Promise<void> }> {
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  await client.query('BEGIN');
  await client.query(`LOCK TABLE "${schema}".${table} IN ${mode} MODE`);
  return { client, release: async () => void (await client.query('COMMIT')) };
}

/**
 * Publishes `count` events, takes the outbox in SHARE mode (it holds the prune's DELETE and lets the
 * relay's reads on), starts a relay that keeps nothing (`retention: '1ms'`), and resolves once every
 * event is delivered and its first prune waits for the lock. The lock is taken before the relay
 * starts, so that its first prune is the one held (taken after the delivery, a prune could already
 * have deleted a batch: CI saw 500 left).
 */
async function relayWithPruneHeld(opened: { mailroom: Mailroom; schema: string }, count: number, type: string): Promise<{ relay: Relay; lock: Awaited<ReturnType<typeof lockTable>> }> {
  const { mailroom, schema } = opened;
  const noted = defineEvent<{ n: number }>(type, { version: 1 });
  await mailroom.publishMany(noted, Array.from({ length: count }, (_, n) => ({ n })));
  const lock = await lockTable(schema, 'outbox', 'SHARE');
  const nowhere: RelayTarget = { name: 'nowhere', publish: async () => {} };
  const relay = mailroom.relay({ to: [nowhere], internal: false, retention: '1ms', pollInterval: 50 });
  let delivered = 0;
  const all = new Promise<void>((resolve) => relay.on('delivered', ({ count: n }) => (delivered += n) >= count && resolve()));
  await relay.start();
  await all;
  await blockedOn(lock.client, schema, 'outbox', 10_000, 'DELETE');
  return { relay, lock };
}

describe('stopping waits for background passes in flight, and cancels one still blocked past its timeout (PostgreSQL)', { skip: databaseUrl ? false : 'TEST_DATABASE_URL is not set' }, () => {
  const clients: pg.Client[] = [];
  const schemas: string[] = [];
  after(async () => {
    for (const c of clients) await c.end().catch(() => {});
    for (const m of mailrooms) await m.close({ timeout: 1000 }).catch(() => {}); // a failed test left it open
    if (schemas.length === 0) return;
    const admin = new pg.Client({ connectionString: databaseUrl });
    await admin.connect();
    for (const s of schemas) await admin.query(`DROP SCHEMA IF EXISTS "${s}" CASCADE`);
    await admin.end();
  });

  /** A worker started with nothing to do, its maintenance pass (lease rescue) every 50 ms. */
  async function idleWorker(type: string) {
    const opened = await openOwn({ rescueInterval: '50ms' });
    schemas.push(opened.schema);
    const chore = defineJob<{ n: number }>(type, { queue: 'shutdown' });
    const worker = opened.mailroom.worker({ queues: ['shutdown'], handlers: { [chore.name]: async () => {} } });
    await worker.start();
    return { opened, worker };
  }

  /** A consumer group started with nothing to do, its inbox prune every second (a tenth of the retention, at least a second). */
  async function idleGroup(type: string) {
    const opened = await openOwn({});
    schemas.push(opened.schema);
    const noted = defineEvent<{ n: number }>(type, { version: 1 });
    const consumer = opened.mailroom.consumer({ group: 'shutdown', inboxRetention: '10s', retry: { maxAttempts: 1 }, handlers: { [noted.type]: async () => {} } });
    await consumer.start();
    return { opened, consumer };
  }

  /**
   * With `table` locked from outside and a pass of `mailroom` waiting for it: `stop()` must not
   * resolve while the lock is held, nothing of the pass may touch the table once it has, and
   * `close()` after it must report nothing.
   */
  async function stopWaitsForPass(opened: { mailroom: Mailroom; schema: string; errors: unknown[] }, table: string, stop: () => Promise<void>): Promise<void> {
    const { mailroom, schema, errors } = opened;
    const lock = await lockTable(schema, table);
    clients.push(lock.client);
    await blockedOn(lock.client, schema, table, 10_000);
    let stopped = false;
    const stopping = stop().then(() => void (stopped = true));
    await sleep(HELD_MS);
    assert.equal(stopped, false, `stop() resolved while the pass still waited for the lock on ${table}`);
    await lock.release();
    await stopping;
    const { rows } = await lock.client.query(`SELECT count(*)::int AS n FROM pg_locks WHERE relation = $1::regclass`, [`"${schema}".${table}`]);
    assert.equal(rows[0].n, 0, `no statement of the pass still holds or waits for ${table} once stop() resolved`);
    await mailroom.close();
    await sleep(200);
    assert.deepEqual(errors.map((e) => (e instanceof Error ? e.message : String(e))), []);
  }

  it("a worker's stop waits for its maintenance pass, and close() after it reports nothing", async () => {
    const { opened, worker } = await idleWorker('shutdown.chore');
    // The rescue of expired leases writes job_errors, which nothing else the idle worker does touches.
    await stopWaitsForPass(opened, 'job_errors', () => worker.stop());
  });

  it("a consumer group's stop waits for its inbox prune, and close() after it reports nothing", async () => {
    const { opened, consumer } = await idleGroup('shutdown.noted');
    await stopWaitsForPass(opened, 'inbox', () => consumer.stop());
  });

  it("a relay's stop waits for its background prune, which begins no more batches once stopping", async () => {
    const opened = await openOwn({});
    const { mailroom, schema } = opened;
    schemas.push(schema);
    // Three batches of 1,000 would empty the outbox.
    const { relay, lock } = await relayWithPruneHeld(opened, 2500, 'shutdown.relayed');
    clients.push(lock.client);
    let stopped = false;
    const stopping = relay.stop().then(() => void (stopped = true));
    await sleep(HELD_MS);
    assert.equal(stopped, false, 'stop() resolved while the prune still waited for the lock');
    await lock.release();
    await stopping;
    const { rows } = await lock.client.query(`SELECT count(*)::int AS n FROM "${schema}".outbox`);
    assert.equal(rows[0].n, 1500, 'the prune finished the batch it was in (1,000 events) and began no other');
    await mailroom.close();
    assert.deepEqual(opened.errors.map((e) => (e instanceof Error ? e.message : String(e))), []);
  });

  /**
   * With `table` locked from outside (or `held` already, its pass waiting) and a pass of `mailroom`
   * waiting for it: `stop()` must resolve after about `limitMs` while the lock is still held, leave
   * no statement waiting for the table, and report one error naming the pass; `close()` after it
   * must report nothing more.
   */
  async function stopCancelsPass(
    opened: { mailroom: Mailroom; schema: string; errors: unknown[] },
    table: string,
    stop: () => Promise<void>,
    pass: string,
    limitMs: number,
    held?: Awaited<ReturnType<typeof lockTable>>,
  ): Promise<void> {
    const { mailroom, schema, errors } = opened;
    const lock = held ?? (await lockTable(schema, table));
    clients.push(lock.client);
    if (!held) await blockedOn(lock.client, schema, table, 10_000);
    const began = Date.now();
    await stop();
    const waited = Date.now() - began;
    assert.ok(waited >= limitMs - 50, `stop() resolved after ${waited} ms, before its timeout of ${limitMs} ms`);
    assert.ok(waited < limitMs + 5000, `stop() took ${waited} ms with a timeout of ${limitMs} ms: the blocked pass was not cancelled`);
    await lock.client.query('SELECT pg_stat_clear_snapshot()');
    const { rows } = await lock.client.query(`SELECT count(*)::int AS n FROM pg_locks WHERE relation = $1::regclass AND NOT granted`, [`"${schema}".${table}`]);
    assert.equal(rows[0].n, 0, `a statement still waits for ${table} after stop() resolved`);
    const messages = errors.map((e) => (e instanceof Error ? e.message : String(e)));
    assert.equal(messages.length, 1, `one error reported, got: ${messages.join(' | ')}`);
    assert.match(messages[0]!, new RegExp(`the ${pass} pass was cancelled: stop\\(\\) waited \\d+ ms for it`));
    await lock.release();
    await mailroom.close();
    await sleep(200);
    assert.equal(errors.length, 1, 'close() reported nothing more');
  }

  it("a worker's maintenance pass blocked past the stop's timeout is cancelled, and the stop resolves", async () => {
    const { opened, worker } = await idleWorker('shutdown.cancelled-chore');
    // No handler runs, so the pass gets the whole timeout, and at least a second.
    await stopCancelsPass(opened, 'job_errors', () => worker.stop({ timeout: '1s' }), 'lease rescue', 1000);
  });

  it("a consumer group's inbox prune blocked past the stop's timeout is cancelled, and the stop resolves", async () => {
    const { opened, consumer } = await idleGroup('shutdown.cancelled-noted');
    // A timeout under a second still gives the pass a second (a batch that merely runs is never cut off).
    await stopCancelsPass(opened, 'inbox', () => consumer.stop({ timeout: '200ms' }), 'inbox prune', 1000);
  });

  it("a relay's outbox prune blocked past the stop's timeout is cancelled: its batch rolled back, nothing deleted", async () => {
    const opened = await openOwn({});
    const { mailroom, schema } = opened;
    schemas.push(schema);
    const { relay, lock } = await relayWithPruneHeld(opened, 1500, 'shutdown.cancelled-relayed');
    await stopCancelsPass(opened, 'outbox', () => relay.stop({ timeout: '1500ms' }), 'outbox prune', 1500, lock);
    const admin = new pg.Client({ connectionString: databaseUrl });
    await admin.connect();
    try {
      const { rows } = await admin.query(`SELECT count(*)::int AS n FROM "${schema}".outbox`);
      assert.equal(rows[0].n, 1500, 'the cancelled DELETE was rolled back: every event is still there');
    } finally {
      await admin.end();
    }
  });
});

/** A target whose publish never answers; `entered` resolves at its first call, `signals` holds each call's `context.signal`. */
function hangingTarget(name: string, readAhead: boolean): { target: RelayTarget; entered: Promise<void>; signals: (AbortSignal | undefined)[] } {
  let enter!: () => void;
  const entered = new Promise<void>((resolve) => (enter = resolve));
  const signals: (AbortSignal | undefined)[] = [];
  const target: RelayTarget = {
    name,
    readAhead,
    publish: (_events, context) => {
      signals.push(context.signal);
      enter();
      return new Promise<never>(() => {});
    },
  };
  return { target, entered, signals };
}

/** Checks that the relay told the hung publish it gave up on it: its signal aborted, with a reason naming the stop. */
function publishCalledOff(signals: readonly (AbortSignal | undefined)[]): void {
  assert.ok(signals.length >= 1, 'the target was called');
  for (const signal of signals) {
    assert.ok(signal instanceof AbortSignal, 'the publish got a signal');
    assert.ok(signal.aborted, "the publish's signal is aborted once the stop gave up on it");
    assert.match(String((signal.reason as Error).message), /stopped: rounds were still in flight \d+ ms into stop\(\)/);
  }
}

/** Stops `relay` with a 1 s timeout and checks it resolved after about that long, with one error naming `target`'s round. */
async function stopCutsRoundShort(relay: Relay, errors: unknown[], target: string): Promise<void> {
  const began = Date.now();
  await relay.stop({ timeout: '1s' });
  const waited = Date.now() - began;
  assert.ok(waited >= 950, `stop() resolved after ${waited} ms, before its timeout of 1000 ms`);
  assert.ok(waited < 4000, `stop() took ${waited} ms with a timeout of 1000 ms: the round in flight was waited for`);
  const messages = errors.map((e) => (e instanceof Error ? e.message : String(e)));
  assert.equal(messages.length, 1, `one error reported, got: ${messages.join(' | ')}`);
  assert.match(messages[0]!, new RegExp(`the round in flight for target ${target} did not end within 1000 ms of stop\\(\\)`));
}

/** Schemas and clients of a suite, dropped and closed (with every mailroom still open) after it. */
function cleanedUp(): { schemas: string[]; clients: pg.Client[] } {
  const made = { schemas: [] as string[], clients: [] as pg.Client[] };
  after(async () => {
    for (const c of made.clients) await c.end().catch(() => {});
    for (const m of mailrooms) await m.close({ timeout: 1000 }).catch(() => {});
    const admin = new pg.Client({ connectionString: databaseUrl });
    await admin.connect();
    for (const s of made.schemas) await admin.query(`DROP SCHEMA IF EXISTS "${s}" CASCADE`);
    await admin.end();
  });
  return made;
}

/** A transaction left open on its own connection (pushed to `clients`); `waiting()` counts the sessions it blocks. */
async function holder(clients: pg.Client[]): Promise<{ client: pg.Client; waiting: () => Promise<number> }> {
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  clients.push(client);
  await client.query('BEGIN');
  const pid = (await client.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
  const waiting = async () => {
    await client.query('SELECT pg_stat_clear_snapshot()');
    return (await client.query('SELECT count(*)::int AS n FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))', [pid])).rows[0].n as number;
  };
  return { client, waiting };
}

/**
 * Stops with a 1 s timeout (`stop` must pass it): it must resolve after the timeout and within 4 s,
 * leave nothing waiting for the lock (with `waiting`), and report exactly one error matching `reported`.
 */
async function stopsAfterOneSecond(stop: () => Promise<void>, errors: unknown[], reported: RegExp, waiting?: () => Promise<number>): Promise<void> {
  const began = Date.now();
  await stop();
  const waited = Date.now() - began;
  assert.ok(waited >= 950 && waited < 4000, `stop() took ${waited} ms with a timeout of 1000 ms`);
  if (waiting) assert.equal(await waiting(), 0, 'a statement still waits for the lock after stop() resolved');
  const messages = errors.map((e) => (e instanceof Error ? e.message : String(e)));
  assert.equal(messages.length, 1, `one error reported, got: ${messages.join(' | ')}`);
  assert.match(messages[0]!, reported);
}

async function until(check: () => Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!(await check())) {
    assert.ok(Date.now() < deadline, `${what} within 10 s`);
    await sleep(25);
  }
}

describe("a relay's stop does not wait past its timeout for a round in flight or a lease's hand-back (PostgreSQL)", { skip: databaseUrl ? false : 'TEST_DATABASE_URL is not set' }, () => {
  const { schemas, clients } = cleanedUp();

  for (const readAhead of [false, true]) {
    it(`a ${readAhead ? 'read-ahead' : 'transactional'} target's publish that never answers is left behind; its lease runs out and another relay delivers the batch`, { timeout: 60_000 }, async () => {
      const opened = await openOwn({});
      const { mailroom, schema, errors } = opened;
      schemas.push(schema);
      const noted = defineEvent<{ n: number }>(`shutdown.hung-${readAhead ? 'ahead' : 'tx'}`, { version: 1 });
      const { target, entered, signals } = hangingTarget('hung', readAhead);
      const relay = mailroom.relay({ to: [target], internal: false, pollInterval: 50, lease: '4s' });
      await relay.start();
      const published = await mailroom.publishMany(noted, [{ n: 1 }, { n: 2 }, { n: 3 }]);
      await entered;
      assert.equal(signals[0]?.aborted, false, 'the signal is not aborted while the relay waits for the publish');
      await stopCutsRoundShort(relay, errors, 'hung');
      publishCalledOff(signals);

      const db = new pg.Client({ connectionString: databaseUrl });
      await db.connect();
      clients.push(db);
      const { rows } = await db.query(`SELECT holder, (extract(epoch FROM locked_until) * 1000)::float8 AS until FROM "${schema}".relay_cursors WHERE target = 'hung'`);
      assert.equal(rows[0].holder, relay.id, 'the lease was not handed back while the publish may still be out');
      const leaseEnds = rows[0].until as number;
      assert.ok(leaseEnds > Date.now(), 'the lease still runs');
      // The round's transaction was ended: with its connection still checked out, the pool's end would wait.
      const closing = Date.now();
      await mailroom.close();
      assert.ok(Date.now() - closing < 2000, `close() took ${Date.now() - closing} ms after the stop`);

      const next = await createMailroom({ database: databaseUrl, schema });
      mailrooms.push(next);
      const got: string[] = [];
      const sinkSignals: (boolean | undefined)[] = [];
      let acquiredAt = 0;
      const all = new Promise<void>((resolve) => {
        const sink: RelayTarget = {
          name: 'hung',
          publish: async (events, context) => {
            sinkSignals.push(context.signal?.aborted);
            for (const e of events) got.push(e.envelope.id);
            if (got.length >= 3) resolve();
          },
        };
        const second = next.relay({ to: [sink], internal: false, pollInterval: 50 });
        second.on('lease-acquired', () => (acquiredAt = Date.now()));
        void second.start();
      });
      await Promise.race([all, sleep(15_000).then(() => assert.fail(`the next relay delivered ${got.length} of 3 events in 15 s`))]);
      assert.ok(acquiredAt >= leaseEnds - 100, `the next relay took the lease ${leaseEnds - acquiredAt} ms before it ran out`);
      assert.deepEqual([...got].sort(), published.ids.sort(), 'every event delivered, once');
      assert.ok(sinkSignals.length > 0 && sinkSignals.every((aborted) => aborted === false), `a running relay hands every batch a signal not aborted: ${JSON.stringify(sinkSignals)}`);
    });
  }

  it("a target whose close() never resolves is not waited for past the stop's timeout; the other targets' leases are handed back", { timeout: 60_000 }, async () => {
    const opened = await openOwn({});
    const { mailroom, schema, errors } = opened;
    schemas.push(schema);
    const stuck: RelayTarget = { name: 'stuck-close', publish: async () => {}, close: () => new Promise<never>(() => {}) };
    const relay = mailroom.relay({ to: [stuck], internal: false, pollInterval: 50 });
    const leased = new Promise<void>((resolve) => relay.on('lease-acquired', () => resolve()));
    await relay.start();
    await leased;
    await stopsAfterOneSecond(() => relay.stop({ timeout: '1s' }), errors, /target stuck-close's close\(\) did not resolve within the stop's timeout/);
    const db = new pg.Client({ connectionString: databaseUrl });
    await db.connect();
    clients.push(db);
    const { rows } = await db.query(`SELECT holder FROM "${schema}".relay_cursors WHERE target = 'stuck-close'`);
    assert.equal(rows[0].holder, null, 'a round that ended hands its lease back, whatever its close() does');
  });

  it("a round waiting for a lock past the stop's timeout has its statement cancelled: nothing waits for the lock after the stop", { timeout: 60_000 }, async () => {
    const opened = await openOwn({});
    const { mailroom, schema, errors } = opened;
    schemas.push(schema);
    const noted = defineEvent<{ n: number }>('shutdown.locked-round', { version: 1 });
    let delivered = 0;
    const sink: RelayTarget = { name: 'sink', publish: async (events) => void (delivered += events.length) };
    const relay = mailroom.relay({ to: [sink], internal: false, pollInterval: 50 });
    const first = new Promise<void>((resolve) => relay.on('delivered', () => resolve()));
    await relay.start();
    await mailroom.publish(noted, { n: 0 });
    await first;
    // The cursor's row locked from outside: the next round's fenced start waits for it.
    const lock = await holder(clients);
    await lock.client.query(`SELECT 1 FROM "${schema}".relay_cursors WHERE target = 'sink' FOR UPDATE`);
    await mailroom.publishMany(noted, [{ n: 1 }, { n: 2 }]);
    await until(async () => (await lock.waiting()) > 0, 'a round waited for the locked cursor');
    await stopCutsRoundShort(relay, errors, 'sink');
    assert.equal(await lock.waiting(), 0, 'a statement of the relay still waits for the lock after stop() resolved');
    await lock.client.query('COMMIT');
    assert.equal(delivered, 1, 'the round cut short delivered nothing');
    const closing = Date.now();
    await mailroom.close();
    assert.ok(Date.now() - closing < 2000, `close() took ${Date.now() - closing} ms after the stop`);
  });

  it("an idle relay whose cursor row is locked: the release is cancelled, reported, and the lease left to run out", { timeout: 60_000 }, async () => {
    const opened = await openOwn({});
    const { mailroom, schema, errors } = opened;
    schemas.push(schema);
    const noted = defineEvent<{ n: number }>('shutdown.locked-release', { version: 1 });
    const sink: RelayTarget = { name: 'sink', publish: async () => {} };
    // Never started: flush() takes the lease and delivers, and no round runs after it, so only the release meets the lock.
    const relay = mailroom.relay({ to: [sink], internal: false, lease: '30s' });
    await mailroom.publish(noted, { n: 0 });
    assert.equal((await relay.flush()).sink?.delivered, 1);
    const lock = await holder(clients);
    await lock.client.query(`SELECT 1 FROM "${schema}".relay_cursors WHERE target = 'sink' FOR UPDATE`);
    await stopsAfterOneSecond(() => relay.stop({ timeout: '1s' }), errors, /handing back target sink's lease did not end within \d+ ms .*the lease runs out within 30000 ms instead/, lock.waiting);
    await lock.client.query('COMMIT');
    const { rows } = await lock.client.query(`SELECT holder FROM "${schema}".relay_cursors WHERE target = 'sink'`);
    assert.equal(rows[0].holder, relay.id, 'the cancelled release changed nothing: the lease runs out instead');
  });
});

describe("a relay's stop does not wait past its timeout for a round in flight (PGlite)", () => {
  it('a publish that never answers is left behind and its transaction rolled back: the one connection answers again', { timeout: 60_000 }, async () => {
    const [pglite] = testDatabases();
    const t = await pglite!.open();
    const errors: unknown[] = [];
    t.mailroom.on('error', ({ error }) => void errors.push(error));
    const noted = defineEvent<{ n: number }>('shutdown.hung-embedded', { version: 1 });
    const { target, entered, signals } = hangingTarget('hung', false);
    const relay = t.mailroom.relay({ to: [target], internal: false, pollInterval: 50 });
    await relay.start();
    await t.mailroom.publish(noted, { n: 1 });
    await entered;
    await stopCutsRoundShort(relay, errors, 'hung');
    publishCalledOff(signals);
    // PGlite serves one connection: a transaction left open would hold every later statement.
    const answered = await Promise.race([t.sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${t.schema}".outbox`).then((rows) => rows[0]!.n), sleep(5000).then(() => 'no answer')]);
    assert.equal(answered, 1, 'the embedded database answers after the stop, and the event is still in the outbox');
    const cursor = await t.sql<{ delivered: string }>(`SELECT cursor_position::text AS delivered FROM "${t.schema}".relay_cursors WHERE target = 'hung'`);
    assert.equal(cursor[0]?.delivered, '0', 'the cursor did not move past the undelivered event');
  });
});

describe("a worker's and a broker group's stop do not wait past their timeout for writes held by a lock (PostgreSQL)", { skip: databaseUrl ? false : 'TEST_DATABASE_URL is not set' }, () => {
  const { schemas, clients } = cleanedUp();

  /** Stops with a 1 s timeout: it must resolve after the timeout and its second of grace, report one error, and leave nothing waiting. */
  async function stopCutsWritesShort(stop: () => Promise<void>, errors: unknown[], waiting: () => Promise<number>): Promise<void> {
    const began = Date.now();
    await stop();
    const waited = Date.now() - began;
    assert.ok(waited >= 1950, `stop() resolved after ${waited} ms, before its timeout of 1000 ms and a second of grace`);
    assert.ok(waited < 5000, `stop() took ${waited} ms with a timeout of 1000 ms: the write waiting for the lock was waited for`);
    assert.equal(await waiting(), 0, 'a statement of the worker still waits for the lock after stop() resolved');
    const messages = errors.map((e) => (e instanceof Error ? e.message : String(e)));
    assert.equal(messages.length, 1, `one error reported, got: ${messages.join(' | ')}`);
    assert.match(messages[0]!, /stop\(\) gave up on its writes \(a claim, a job's outcome or its release\) a second after its timeout of 1000 ms/);
  }

  it("a job's completion waiting for a row lock is cancelled: the job keeps its claim for the rescue, and close() does not wait", { timeout: 60_000 }, async () => {
    const opened = await openOwn({});
    const { mailroom, schema, errors } = opened;
    schemas.push(schema);
    const chore = defineJob<{ n: number }>('shutdown.locked-completion', { queue: 'locked' });
    let letGo!: () => void;
    const started = new Promise<void>((resolve) => {
      const handlers = {
        [chore.name]: async () => {
          resolve();
          await new Promise<void>((r) => (letGo = r));
        },
      };
      void mailroom.worker({ queues: ['locked'], handlers, concurrency: 1, maintenance: false, pollInterval: '50ms' }).start();
    });
    const id = await mailroom.enqueue(chore, { n: 1 });
    await started;
    const lock = await holder(clients);
    await lock.client.query(`SELECT 1 FROM "${schema}".jobs WHERE id = $1 FOR UPDATE`, [id]);
    letGo();
    await until(async () => (await lock.waiting()) > 0, "the job's completion waited for the locked row");
    await stopCutsWritesShort(() => mailroom.close({ timeout: '1s' }), errors, lock.waiting);
    await lock.client.query('COMMIT');
    const { rows } = await lock.client.query(`SELECT state FROM "${schema}".jobs WHERE id = $1`, [id]);
    assert.equal(rows[0].state, 'active', 'the cancelled completion wrote nothing: the job waits for its lease to run out');
  });

  it("a claim waiting for a table lock is cancelled, and the stop resolves", { timeout: 60_000 }, async () => {
    const opened = await openOwn({});
    const { mailroom, schema, errors } = opened;
    schemas.push(schema);
    const chore = defineJob<{ n: number }>('shutdown.locked-claim', { queue: 'locked' });
    const worker = mailroom.worker({ queues: ['locked'], handlers: { [chore.name]: async () => {} }, maintenance: false, pollInterval: '50ms' });
    await worker.start();
    const lock = await holder(clients);
    await lock.client.query(`LOCK TABLE "${schema}".jobs IN ACCESS EXCLUSIVE MODE`);
    await until(async () => (await lock.waiting()) > 0, 'a claim waited for the locked table');
    await stopCutsWritesShort(() => worker.stop({ timeout: '1s' }), errors, lock.waiting);
    await lock.client.query('COMMIT');
  });

  it("a broker group's store waiting for a key's lock is cancelled at the stop's timeout, and its message given back to the broker", { timeout: 60_000 }, async () => {
    const opened = await openOwn({});
    const { mailroom, schema, errors } = opened;
    schemas.push(schema);
    const shipped = defineEvent<{ n: number }>('shutdown.shipped', { version: 1 });
    const source = scriptedSource('warehouse');
    const consumer = mailroom.consumer({ group: 'stopping', source, pollInterval: '50ms', handlers: { [shipped.type]: async () => {} } });
    await consumer.start();
    const message = (id: string, n: number) => JSON.stringify({ specversion: '1.0', id, source: 'https://warehouse.example', type: shipped.type, subject: 'order-1', data: { n } });
    assert.equal(await source.push(message('m1', 1)), 'ack');
    const lock = await holder(clients);
    const completed = async () => (await lock.client.query(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE state = 'completed'`)).rows[0].n === 1;
    await until(completed, 'the first message was handled');
    // The key's row locked from outside: the next store of that key waits for it.
    await lock.client.query(`SELECT 1 FROM "${schema}".ordering_keys WHERE key = 'order-1' FOR UPDATE`);
    const second = source.push(message('m2', 2));
    await until(async () => (await lock.waiting()) > 0, "the second message's store waited for the key");
    await stopsAfterOneSecond(() => consumer.stop({ timeout: '1s' }), errors, /the store in flight from scripted warehouse did not end within 1000 ms of stop\(\)/, lock.waiting);
    assert.equal(await second, 'nack', 'the message whose store was cut short is given back to the broker');
    await lock.client.query('COMMIT');
    const { rows } = await lock.client.query(`SELECT count(*)::int AS n FROM "${schema}".jobs`);
    assert.equal(rows[0].n, 1, 'the cancelled store was rolled back: only the first message is stored');
  });
});

describe('a stop is one deadline, and what it closes last does not hold it (PostgreSQL)', { skip: databaseUrl ? false : 'TEST_DATABASE_URL is not set' }, () => {
  const { schemas, clients } = cleanedUp();

  it("a broker group's source whose stop() never resolves is left behind at the timeout, and the handlers get only what is left of it", { timeout: 60_000 }, async () => {
    const opened = await openOwn({});
    const { mailroom, schema, errors } = opened;
    schemas.push(schema);
    const shipped = defineEvent<{ n: number }>('shutdown.shipped-hanging', { version: 1 });
    const source = scriptedSource('stuck-broker', { stopHangs: true });
    let aborted = false;
    let started!: () => void;
    const running = new Promise<void>((resolve) => (started = resolve));
    const handlers = {
      [shipped.type]: async (_event: unknown, context: { signal: AbortSignal }) => {
        started();
        await new Promise<void>((resolve) => context.signal.addEventListener('abort', () => resolve(), { once: true }));
        aborted = true;
      },
    };
    const consumer = mailroom.consumer({ group: 'stuck', source, pollInterval: '50ms', handlers });
    await consumer.start();
    const message = JSON.stringify({ specversion: '1.0', id: 'm1', source: 'https://warehouse.example', type: shipped.type, data: { n: 1 } });
    assert.equal(await source.push(message), 'ack');
    await running;
    const began = Date.now();
    await consumer.stop({ timeout: '2s' });
    const waited = Date.now() - began;
    // The source's stop takes the whole timeout; the worker then gets none of it: its handler is aborted at once.
    assert.ok(waited >= 1950, `stop() resolved after ${waited} ms, before its timeout of 2000 ms`);
    assert.ok(waited < 3500, `stop() took ${waited} ms with a timeout of 2000 ms: the timeout was given twice, or the source's stop was waited for`);
    assert.ok(aborted, 'the running handler was aborted');
    const messages = errors.map((e) => (e instanceof Error ? e.message : String(e)));
    assert.equal(messages.length, 1, `one error reported, got: ${messages.join(' | ')}`);
    assert.match(messages[0]!, /consumer stuck: scripted source stuck-broker's stop\(\) did not resolve within \d+ ms/);
    const lock = await holder(clients);
    const { rows } = await lock.client.query(`SELECT state FROM "${schema}".jobs`);
    assert.deepEqual(
      rows.map((r) => r.state),
      ['available'],
      'the aborted handler\'s job was handed back to the queue',
    );
  });

  it("a worker's stop does not wait past its timeout to remove its wake-up row held by a lock", { timeout: 60_000 }, async () => {
    const opened = await openOwn({});
    const { mailroom, schema, errors } = opened;
    schemas.push(schema);
    const worker = mailroom.worker({ queues: ['quiet'], handlers: {}, maintenance: false, pollInterval: '50ms' });
    await worker.start();
    const lock = await holder(clients);
    const listed = async () => (await lock.client.query(`SELECT count(*)::int AS n FROM "${schema}".wake_listeners`)).rows[0].n > 0;
    await until(listed, 'the idle worker recorded itself in wake_listeners');
    await lock.client.query(`SELECT 1 FROM "${schema}".wake_listeners FOR UPDATE`);
    await stopsAfterOneSecond(() => worker.stop({ timeout: '1s' }), errors, /stopped without removing its row from wake_listeners: the removal did not end within \d+ ms/, lock.waiting);
    await lock.client.query('COMMIT');
  });

  for (const kind of ['worker', 'relay'] as const) {
    it(`a ${kind} whose first wake-up registration waits for a lock stops without waiting for it, and close() does not wait for the lock`, { timeout: 60_000 }, async () => {
      const opened = await openOwn({});
      const { mailroom, schema, errors } = opened;
      schemas.push(schema);
      const lock = await holder(clients);
      // Blocks the registration's INSERT (and a removal's DELETE), not the claims or the relay's rounds.
      await lock.client.query(`LOCK TABLE "${schema}".wake_listeners IN EXCLUSIVE MODE`);
      const sink: RelayTarget = { name: 'sink', publish: async () => {} };
      const listener =
        kind === 'worker'
          ? mailroom.worker({ queues: ['quiet'], handlers: {}, maintenance: false, pollInterval: '50ms' })
          : mailroom.relay({ to: [sink], internal: false, pollInterval: 50 });
      await listener.start();
      await blockedOn(lock.client, schema, 'wake_listeners', 10_000, 'WITH stale');
      const began = Date.now();
      await listener.stop({ timeout: '3s' });
      const waited = Date.now() - began;
      // Nothing was recorded, so there is nothing to remove: the stop neither waits for the lock (3 s or more) nor reports.
      assert.ok(waited < 2000, `stop() took ${waited} ms: it waited for the lock (the registration, or removing a row never recorded)`);
      assert.equal(await lock.waiting(), 0, 'a statement still waits for the lock after stop() resolved');
      assert.deepEqual(errors.map((e) => (e instanceof Error ? e.message : String(e))), [], 'nothing reported');
      const closing = Date.now();
      await mailroom.close();
      assert.ok(Date.now() - closing < 2_000, `close() took ${Date.now() - closing} ms with the lock still held`);
      await lock.client.query('COMMIT');
    });
  }
});
