/**
 * A consumer group fed by a broker source, mailroom's side: each message is
 * stored (a job of the group, or a dead letter) before the source hears ack;
 * a redelivery stores nothing new and takes effect once; what the database
 * refuses is retried and not acked; one bad message never blocks the rest.
 * The source here is driven by the test; the adapters run the shared suite
 * against the real brokers in test/brokers.test.ts.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { defineEvent, handleEvent, INVALID_MESSAGE_TYPE, toEnvelope, ValidationError, type ConsumerContext, type IngestedInfo } from '../src/index.ts';
import { ingestQueries } from '../src/consumers/ingest-queries.ts';
import { HOLD_MIN_CAPACITY, MAX_HOLD_MS } from '../src/consumers/ingest.ts';
import { testDatabases, type TestMailroom } from './helpers/databases.ts';
import { waitForEvents } from './helpers/events.ts';
import { flushUntil } from './helpers/relay.ts';
import { explainPrepared, itPlans, PLAN_MODES, sqlArray } from './helpers/plans.ts';
import { scriptedSource } from './helpers/scripted-source.ts';

const shipped = defineEvent<{ order: string }>('ingest.order-shipped', { version: 1 });

function foreignEvent(id: string, data: unknown, extra: Record<string, unknown> = {}): string {
  return JSON.stringify({ specversion: '1.0', id, source: 'https://warehouse.example/shipping', type: shipped.type, data, ...extra });
}

async function effects(t: TestMailroom): Promise<string[]> {
  const rows = await t.sql<{ order_id: string }>(`SELECT order_id FROM "${t.schema}".shipments ORDER BY seq`);
  return rows.map((r) => r.order_id);
}

async function shippingGroup(t: TestMailroom, options: { maxMessageBytes?: number } = {}) {
  await t.sql(`CREATE TABLE "${t.schema}".shipments (seq serial PRIMARY KEY, order_id text NOT NULL)`);
  const source = scriptedSource('warehouse');
  const consumer = t.mailroom.consumer({
    group: 'shipping',
    source,
    pollInterval: 20,
    ...options,
    handlers: {
      [shipped.type]: handleEvent(shipped, async (event, ctx: ConsumerContext) => {
        await ctx.tx.query(`INSERT INTO "${t.schema}".shipments (order_id) VALUES ($1)`, [event.data.order]);
      }),
    },
  });
  const ingested: IngestedInfo[] = [];
  consumer.on('ingested', (info) => ingested.push(info));
  await consumer.start();
  return { source, consumer, ingested };
}

/**
 * A group whose handler records each order it runs, holding those that `held` picks until
 * `open(order)` or `release()` (every one, from then on); `ingested` collects the group's stored batches.
 */
async function gatedGroup(t: TestMailroom, held: (order: string) => boolean, options: { concurrency?: number; prefetch?: number; pollInterval?: number } = {}) {
  const source = scriptedSource('warehouse');
  const gates = new Map<string, () => void>();
  let released = false;
  const ran: string[] = [];
  const consumer = t.mailroom.consumer({
    group: 'shipping',
    source,
    pollInterval: 20,
    ...options,
    handlers: {
      [shipped.type]: handleEvent(shipped, async (event) => {
        ran.push(event.data.order);
        if (held(event.data.order) && !released) await new Promise<void>((r) => gates.set(event.data.order, r));
      }),
    },
  });
  const ingested: IngestedInfo[] = [];
  consumer.on('ingested', (info) => ingested.push(info));
  await consumer.start();
  const release = (): void => {
    released = true;
    for (const [order, open] of gates) {
      gates.delete(order);
      open();
    }
  };
  const open = async (order: string): Promise<void> => {
    await until(() => gates.has(order));
    gates.get(order)!();
    gates.delete(order);
  };
  return { source, consumer, ran, ingested, open, release };
}

/** Resolves once `done()` holds; fails after 15 s. */
async function until(done: () => boolean): Promise<void> {
  for (let waited = 0; !done(); waited += 10) {
    if (waited > 15_000) throw new Error('timed out after 15 s');
    await new Promise((r) => setTimeout(r, 10));
  }
}

/**
 * Resolves once the group's worker would take a hand-off of its whole capacity, and has for 300 ms:
 * its last claim found the queue empty, nothing runs, and no claim is out (after a warm-up job, before
 * the test's own messages). A worker offers no room while a claim of its own is in flight, and an idle
 * one looks again a few times after it registers for NOTIFY (up to 200 ms apart, see WakeGate).
 */
async function idle(worker: { handOffRoom(queue: string): number | null; readonly capacity: number }): Promise<void> {
  let since = Date.now();
  await until(() => {
    if (worker.handOffRoom('consumer.shipping') !== worker.capacity) since = Date.now();
    return Date.now() - since >= 300;
  });
}

/** Resolves once every row that `rows()` reads is completed; fails after 15 s, naming their states. */
async function allCompleted(rows: () => Promise<{ state: string }[]>): Promise<void> {
  for (let waited = 0; ; waited += 20) {
    const states = (await rows()).map((r) => r.state);
    if (states.every((s) => s === 'completed')) return;
    assert.ok(waited < 15_000, `not all completed after 15 s: ${states.join(', ')}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function jobsOf(t: TestMailroom) {
  return t.sql<{ id: string; type: string; state: string; dead_reason: string | null; last_error: { category: string; message: string } | null; payload: Record<string, unknown> }>(
    `SELECT id, type, state, dead_reason, last_error, payload FROM "${t.schema}".jobs WHERE queue = 'consumer.shipping' ORDER BY created_at, id`,
  );
}

for (const db of testDatabases()) {
  describe(`a consumer group fed by a source, on ${db.name}`, () => {
    it('stores a message as a job before acking it; a redelivery is acked with no second job and no second effect', async () => {
      const t = await db.open();
      const { source, consumer, ingested } = await shippingGroup(t);
      const done = waitForEvents(consumer.worker, 'completed', 3);
      let rowsAtAck = -1;
      const first = await source.push(foreignEvent('order-17', { order: '17' }), {
        onAck: async () => {
          rowsAtAck = (await jobsOf(t)).length;
        },
      });
      assert.equal(first, 'ack');
      assert.equal(rowsAtAck, 1, 'the job was committed when the ack was sent');
      // The same event again (a broker redelivery), a binary-mode event, and mailroom's own envelope.
      assert.equal(await source.push(foreignEvent('order-17', { order: '17' })), 'ack');
      assert.equal(
        await source.push(JSON.stringify({ order: '18' }), {
          headers: { 'ce-specversion': '1.0', 'ce-id': 'order-18', 'ce-source': '/warehouse', 'ce-type': shipped.type, 'content-type': 'application/json' },
        }),
        'ack',
      );
      const own = toEnvelope({
        position: '1', xid: '1', id: '01936f8e-1f2a-7000-8000-000000000001', type: shipped.type, version: 1, source: 'mailroom://test', subject: 'order-19',
        time: new Date(), correlation_id: 'req-19', causation_id: null, traceparent: null, headers: null, data: { order: '19' },
      });
      assert.equal(await source.push(JSON.stringify(own)), 'ack');
      assert.equal(await source.push(JSON.stringify({ ...own, data: { order: 'not again' } })), 'ack', 'same source and id: the same event');
      await done;
      assert.deepEqual((await effects(t)).sort(), ['17', '18', '19']);
      const jobs = await jobsOf(t);
      assert.equal(jobs.length, 3);
      assert.ok(jobs.every((j) => j.state === 'completed'));
      assert.deepEqual(
        ingested.map((i) => [i.stored, i.duplicates, i.deadLettered]).reduce((a, b) => [a[0]! + b[0]!, a[1]! + b[1]!, a[2]! + b[2]!]),
        [3, 2, 0],
      );
      const withKey = jobs.find((j) => (j.payload as { id?: string }).id === own.id)!;
      assert.equal((await t.sql<{ ordering_key: string; correlation_id: string }>(`SELECT ordering_key, correlation_id FROM "${t.schema}".jobs WHERE id = $1`, [withKey.id]))[0]?.ordering_key, 'order-19');
      const stats = (await t.mailroom.stats()).consumers.shipping;
      assert.equal(stats?.source, 'scripted warehouse');
      assert.equal(stats?.unfinished, 0);
    });

    it('stores a batch\'s keyed messages with their key\'s order: each behind the one before it or a stored job of its key, a redelivery counting for nothing', async () => {
      const t = await db.open();
      // Jobs of keys a and b are held by their handlers until release(); those of c run through.
      const { source, consumer, ran, release } = await gatedGroup(t, (order) => !order.startsWith('c'));
      const keyed = (order: string) => foreignEvent(`order-${order}`, { order }, { subject: order[0], partitionkey: order[0] });
      // a1 is stored and held by its running handler; c1 is stored and completed.
      const started = waitForEvents(consumer.worker, 'started', 1);
      assert.equal(await source.push(keyed('a1')), 'ack');
      await started;
      const completed = waitForEvents(consumer.worker, 'completed', 1);
      assert.equal(await source.push(keyed('c1')), 'ack');
      await completed;
      // One batch, with redeliveries of both.
      const batch = ['a2', 'b1', 'a1', 'b2', 'c1', 'a3', 'c2'];
      assert.deepEqual(await Promise.all(batch.map((order) => source.push(keyed(order)))), batch.map(() => 'ack'));
      const rows = await t.sql<{ order: string; blocked: boolean }>(
        `SELECT payload->'data'->>'order' AS order, blocked FROM "${t.schema}".jobs ORDER BY ordering_seq`,
      );
      assert.equal(rows.length, 7, 'one job per event');
      const ofKey = (k: string) => rows.filter((r) => r.order.startsWith(k)).map((r) => `${r.order}:${r.blocked ? 'blocked' : 'runnable'}`);
      assert.deepEqual(ofKey('a'), ['a1:runnable', 'a2:blocked', 'a3:blocked'], 'key a in delivery order, behind the stored a1');
      assert.deepEqual(ofKey('b'), ['b1:runnable', 'b2:blocked'], 'key b in delivery order, b2 behind b1 of the same batch');
      assert.deepEqual(ofKey('c'), ['c1:runnable', 'c2:runnable'], 'nothing queues behind the finished c1');
      const keys = await t.sql<{ key: string }>(`SELECT key FROM "${t.schema}".ordering_keys ORDER BY key`);
      assert.deepEqual(keys.map((k) => k.key), ['a', 'b', 'c'], 'the batches locked their keys');
      release();
      for (let waited = 0; ; waited += 20) {
        const [{ n }] = (await t.sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${t.schema}".jobs WHERE state = 'completed'`)) as [{ n: number }];
        if (n === 7) break;
        assert.ok(waited < 15_000, `${n} of 7 jobs completed after 15 s`);
        await new Promise((r) => setTimeout(r, 20));
      }
      assert.deepEqual(ran.filter((o) => o.startsWith('a')), ['a1', 'a2', 'a3']);
      assert.deepEqual(ran.filter((o) => o.startsWith('b')), ['b1', 'b2']);
      await consumer.stop();
    });

    it('hands a batch to the group\'s idle worker up to its free room: those jobs are stored claimed by it and run without a claim; a key\'s later job and the rest wait in the queue', async () => {
      const t = await db.open();
      // No poll in the test's time: a claim of the worker's own in flight would take the room a hand-off is offered.
      const { source, consumer, ran, ingested, release } = await gatedGroup(t, (order) => order !== 'warm', { concurrency: 3, pollInterval: 60_000 });
      // Once a job has run, the worker's last claim found its queue empty.
      const warm = waitForEvents(consumer.worker, 'completed', 1);
      assert.equal(await source.push(foreignEvent('order-warm', { order: 'warm' })), 'ack');
      await warm;
      await idle(consumer.worker);
      // m1 is a batch of its own (stored as it arrives); m2-m5 gather behind it: room for two more there.
      const started = waitForEvents(consumer.worker, 'started', 3);
      const batch = [['m1', null], ['m2', 'a'], ['m3', 'a'], ['m4', null], ['m5', null]] as const;
      const acks = batch.map(([order, key]) => source.push(foreignEvent(`order-${order}`, { order }, key === null ? {} : { partitionkey: key })));
      assert.deepEqual(await Promise.all(acks), batch.map(() => 'ack'));
      await started;
      const rows = () =>
        t.sql<{ order: string; state: string; attempt: number; claim_count: number; locked_by: string | null; blocked: boolean; unclaimed: boolean }>(
          `SELECT payload->'data'->>'order' AS order, state, attempt, claim_count, locked_by, blocked, started_at = created_at AS unclaimed
             FROM "${t.schema}".jobs WHERE payload->'data'->>'order' <> 'warm' ORDER BY 1`,
        );
      const handed = { state: 'active', attempt: 1, claim_count: 1, locked_by: consumer.worker.id, blocked: false, unclaimed: true };
      const queued = { state: 'available', attempt: 0, claim_count: 0, locked_by: null, unclaimed: null };
      assert.deepEqual(
        (await rows()).map(({ order, ...row }) => [order, row]),
        [
          ['m1', handed],
          ['m2', handed],
          ['m3', { ...queued, blocked: true }],
          ['m4', handed],
          ['m5', { ...queued, blocked: false }],
        ],
        'm1, then m2 and m4 (m3 is behind m2, its key\'s job) were stored claimed by the worker, as it had room for; m5 waits',
      );
      assert.deepEqual(ingested.slice(-2).map((i) => [i.stored, i.handed]), [[1, 1], [4, 2]]);
      await until(() => ran.length === 4);
      assert.deepEqual(ran.slice(1).sort(), ['m1', 'm2', 'm4'], 'the handed jobs run at once');
      release();
      await allCompleted(rows);
      const final = await rows();
      assert.deepEqual(final.map((r) => [r.order, r.claim_count, r.unclaimed]), [['m1', 1, true], ['m2', 1, true], ['m3', 1, false], ['m4', 1, true], ['m5', 1, false]], 'the waiting ones were claimed');
      assert.deepEqual(ran.slice(1).sort(), ['m1', 'm2', 'm3', 'm4', 'm5'], 'each ran once');
      assert.ok(ran.indexOf('m3') > ran.indexOf('m2'), 'm3 after m2, its key\'s job before it');
      await consumer.stop();
    });

    /**
     * A group whose worker has the capacity for holding (concurrency 2, prefetch HOLD_MIN_CAPACITY - 2), made
     * full by HOLD_MIN_CAPACITY held jobs (2 running, the rest in its prefetch); `free()` lets one finish.
     */
    async function fullGroup(t: TestMailroom) {
      const group = await gatedGroup(t, (order) => order !== 'warm', { concurrency: 2, prefetch: HOLD_MIN_CAPACITY - 2 });
      const { source, consumer, ran, open } = group;
      // Once a job has run, the worker's last claim found its queue empty.
      const warm = waitForEvents(consumer.worker, 'completed', 1);
      assert.equal(await source.push(foreignEvent('order-warm', { order: 'warm' })), 'ack');
      await warm;
      await idle(consumer.worker);
      const fill = Array.from({ length: HOLD_MIN_CAPACITY }, (_, i) => `f${i}`);
      assert.deepEqual(await Promise.all(fill.map((order) => source.push(foreignEvent(`order-${order}`, { order })))), fill.map(() => 'ack'));
      await until(() => ran.length === 3);
      const free = async (): Promise<void> => {
        const before = ran.length;
        await open(ran.at(-1)!);
        await until(() => ran.length > before);
      };
      return { ...group, fill, free };
    }

    it(`holds messages unacknowledged while a worker of capacity ${HOLD_MIN_CAPACITY} or more is full, and hands them over once it has room for them: no claim of their own`, async () => {
      const t = await db.open();
      const { source, consumer, ran, ingested, release, fill, free } = await fullGroup(t);
      assert.equal(ingested.slice(1).reduce((n, i) => n + i.handed, 0), fill.length, 'the fill was handed');
      const acked: string[] = [];
      const batch = [['m1', 'a'], ['m2', 'a'], ['m3', null]] as const;
      const acks = batch.map(([order, key]) =>
        source.push(foreignEvent(`order-${order}`, { order }, key === null ? {} : { partitionkey: key })).then((result) => {
          acked.push(order);
          return result;
        }),
      );
      const rows = () =>
        t.sql<{ order: string; state: string; claim_count: number; blocked: boolean; unclaimed: boolean | null }>(
          `SELECT payload->'data'->>'order' AS order, state, claim_count, blocked, started_at = created_at AS unclaimed
             FROM "${t.schema}".jobs WHERE payload->'data'->>'order' LIKE 'm%' ORDER BY 1`,
        );
      await new Promise((r) => setTimeout(r, 100));
      assert.deepEqual([await rows(), acked], [[], []], 'nothing stored or acknowledged while the worker is full');
      // Room for two, then three: all three are stored, m1 and m3 handed, m2 behind m1 (its key's job).
      await free();
      await free();
      assert.deepEqual(acked, [], 'room for two of three is not enough');
      await free();
      assert.deepEqual(await Promise.all(acks), ['ack', 'ack', 'ack']);
      assert.deepEqual([ingested.at(-1)?.stored, ingested.at(-1)?.handed], [3, 2], 'the three in one batch, two handed');
      assert.deepEqual(
        (await rows()).map((r) => [r.order, r.state, r.claim_count, r.blocked, r.unclaimed]),
        [['m1', 'active', 1, false, true], ['m2', 'available', 0, true, null], ['m3', 'active', 1, false, true]],
      );
      release();
      await allCompleted(rows);
      assert.deepEqual((await rows()).map((r) => [r.order, r.claim_count, r.unclaimed]), [['m1', 1, true], ['m2', 1, false], ['m3', 1, true]], 'only m2 was claimed');
      assert.ok(ran.indexOf('m2') > ran.indexOf('m1'), 'm2 after m1, its key\'s job before it');
      await consumer.stop();
    });

    it(`holds messages for a full worker at most ${MAX_HOLD_MS} ms, then stores them to wait in the queue; a stop gives held messages back unstored`, async () => {
      const t = await db.open();
      const { source, consumer, ran, release } = await fullGroup(t);
      const pushed = Date.now();
      assert.equal(await source.push(foreignEvent('order-h1', { order: 'h1' })), 'ack');
      const held = Date.now() - pushed;
      assert.ok(held >= MAX_HOLD_MS - 50, `h1 was acknowledged after ${held} ms, while the worker was full`);
      const stateOf = async (order: string) =>
        (await t.sql<{ state: string; started: boolean }>(`SELECT state, started_at IS NOT NULL AS started FROM "${t.schema}".jobs WHERE payload->'data'->>'order' = $1`, [order]))[0];
      assert.deepEqual(await stateOf('h1'), { state: 'available', started: false }, 'stored to wait in the queue');
      // Held again; the group stops: h2 is given back to the broker (nack), not stored.
      const h2 = source.push(foreignEvent('order-h2', { order: 'h2' }));
      await new Promise((r) => setTimeout(r, 50));
      const stopping = consumer.stop({ timeout: '100ms' });
      assert.equal(await h2, 'nack');
      // The worker is stopping by now (after the ingest): it gives its jobs back after 100 ms and claims nothing more.
      await new Promise((r) => setTimeout(r, 300));
      release();
      await stopping;
      assert.equal(await stateOf('h2'), undefined);
      assert.ok(!ran.includes('h1'), 'h1 waits for the next worker');
      assert.deepEqual(await stateOf('h1'), { state: 'available', started: false });
    });

    it('a batch is not handed past jobs waiting in the queue: those are claimed first', async () => {
      const t = await db.open();
      const source = scriptedSource('warehouse');
      const gates = new Map<string, () => void>();
      const ran: string[] = [];
      const consumer = t.mailroom.consumer({
        group: 'shipping',
        source,
        concurrency: 1,
        // No poll in the test's time: only the worker's own reasons to claim (a stored batch, a finished job).
        pollInterval: 60_000,
        handlers: {
          [shipped.type]: handleEvent(shipped, async (event) => {
            ran.push(event.data.order);
            if (event.data.order !== 'warm') await new Promise<void>((r) => gates.set(event.data.order, r));
          }),
        },
      });
      const ingested: IngestedInfo[] = [];
      consumer.on('ingested', (info) => ingested.push(info));
      await consumer.start();
      const warm = waitForEvents(consumer.worker, 'completed', 1);
      assert.equal(await source.push(foreignEvent('order-warm', { order: 'warm' })), 'ack');
      await warm;
      await idle(consumer.worker);
      // p1 is handed (room for one); p2 and p3 are stored waiting.
      const p1Started = waitForEvents(consumer.worker, 'started', 1);
      assert.deepEqual(await Promise.all(['p1', 'p2', 'p3'].map((order) => source.push(foreignEvent(`order-${order}`, { order })))), ['ack', 'ack', 'ack']);
      await p1Started;
      assert.deepEqual(ingested.slice(-2).map((i) => [i.stored, i.handed]), [[1, 1], [2, 0]]);
      const p1Done = waitForEvents(consumer.worker, 'completed', 1);
      await until(() => gates.has('p1'));
      gates.get('p1')!();
      await p1Done;
      // The worker has room again, and p2 and p3 wait: q1 goes behind them.
      assert.equal(await source.push(foreignEvent('order-q1', { order: 'q1' })), 'ack');
      assert.equal(ingested.at(-1)?.handed, 0, 'q1 was not handed past p2 and p3');
      const rest = waitForEvents(consumer.worker, 'completed', 3);
      const opener = setInterval(() => {
        for (const [order, open] of gates) {
          gates.delete(order);
          open();
        }
      }, 10);
      await rest.finally(() => clearInterval(opener));
      assert.deepEqual(ran, ['warm', 'p1', ...ran.slice(2, 4), 'q1']);
      assert.deepEqual(ran.slice(2, 4).sort(), ['p2', 'p3']);
      await consumer.stop();
    });

    it('hands nothing to a worker whose queue has shared limits: each start is counted by the limits\' own claim', async () => {
      const t = await db.open();
      const source = scriptedSource('warehouse');
      const consumer = t.mailroom.consumer({ group: 'shipping', source, pollInterval: 20, rateLimit: { max: 1000, per: '1s' }, handlers: { [shipped.type]: async () => {} } });
      const ingested: IngestedInfo[] = [];
      consumer.on('ingested', (info) => ingested.push(info));
      await consumer.start();
      for (let round = 0; round < 3; round++) {
        const done = waitForEvents(consumer.worker, 'completed', 2);
        assert.deepEqual(await Promise.all([0, 1].map((i) => source.push(foreignEvent(`order-${round}-${i}`, { order: `${round}-${i}` })))), ['ack', 'ack']);
        await done;
      }
      assert.equal(ingested.reduce((n, i) => n + i.handed, 0), 0);
      const [{ claimed }] = (await t.sql<{ claimed: number }>(`SELECT count(*) FILTER (WHERE started_at > created_at)::int AS claimed FROM "${t.schema}".jobs`)) as [{ claimed: number }];
      assert.equal(claimed, 6, 'every job was claimed');
      await consumer.stop();
    });

    it('a job that was already pruned is caught by the inbox: the redelivery runs no handler and is counted', async () => {
      const t = await db.open();
      const { source, consumer } = await shippingGroup(t);
      const done = waitForEvents(consumer.worker, 'completed', 1);
      await source.push(foreignEvent('order-30', { order: '30' }));
      await done;
      await t.sql(`DELETE FROM "${t.schema}".jobs WHERE queue = 'consumer.shipping'`);
      const again = waitForEvents(consumer.worker, 'completed', 1);
      const duplicate = new Promise((resolve) => consumer.once('duplicate', resolve));
      await source.push(foreignEvent('order-30', { order: '30' }));
      await again;
      await duplicate;
      assert.deepEqual(await effects(t), ['30']);
      assert.equal((await t.mailroom.stats()).consumers.shipping?.duplicatesRejected, 1);
    });

    it('dead-letters at once what is not a CloudEvent (validation) and events no handler knows (unknown-type), keeps the raw message, and acks', async () => {
      const t = await db.open();
      const { source, ingested } = await shippingGroup(t, { maxMessageBytes: 400 });
      const bad: [string, string | Uint8Array, Record<string, string>?][] = [
        ['not json', '{"specversion": "1.0", '],
        ['no id', JSON.stringify({ specversion: '1.0', source: '/x', type: shipped.type, data: {} })],
        ['wrong specversion', JSON.stringify({ specversion: '0.3', id: 'a', source: '/x', type: shipped.type })],
        ['bad time', foreignEvent('t-1', {}, { time: 'yesterday' })],
        ['NUL', foreignEvent('nul-1', { order: 'a\u0000b' })],
        ['too big', foreignEvent('big-1', { order: 'x'.repeat(500) })],
        ['not utf-8', new Uint8Array([0xff, 0xfe, 0x00, 0x41])],
        ['json array', '[1, 2]'],
      ];
      for (const [name, body, headers] of bad) assert.equal(await source.push(body, { messageId: `m-${name}`, headers }), 'ack', name);
      assert.equal(await source.push(foreignEvent('evt-9', { n: 1 }, { type: 'ingest.something-else' })), 'ack');
      // A redelivery of a bad message is not a second dead letter.
      assert.equal(await source.push('{"specversion": "1.0", ', { messageId: 'm-not json' }), 'ack');
      const jobs = await jobsOf(t);
      assert.equal(jobs.length, bad.length + 1);
      assert.ok(jobs.every((j) => j.state === 'dead'), 'all dead at once, none waiting to be retried');
      const invalid = jobs.filter((j) => j.type === INVALID_MESSAGE_TYPE);
      assert.equal(invalid.length, bad.length);
      assert.ok(invalid.every((j) => j.dead_reason === 'validation' && j.last_error?.category === 'validation'));
      const messages = invalid.map((j) => j.last_error!.message).join('\n');
      for (const fragment of ['not JSON', 'id is missing', 'specversion', 'time is not a timestamp', 'NUL', 'maxMessageBytes (400)', 'not valid UTF-8', 'not an object']) {
        assert.ok(messages.includes(fragment), `a dead letter says ${fragment}: ${messages}`);
      }
      assert.ok(invalid.every((j) => j.last_error!.message.includes('from warehouse message')), 'each names where it came from');
      const notJson = invalid.find((j) => j.payload.messageId === 'm-not json')!;
      assert.equal(notJson.payload.body, '{"specversion": "1.0", ');
      const binary = invalid.find((j) => j.payload.messageId === 'm-not utf-8')!;
      assert.equal(binary.payload.encoding, 'base64');
      assert.deepEqual([...Buffer.from(binary.payload.body as string, 'base64')], [0xff, 0xfe, 0x00, 0x41]);
      const unknown = jobs.find((j) => j.type === 'ingest.something-else')!;
      assert.equal(unknown.dead_reason, 'unknown-type');
      assert.match(unknown.last_error!.message, /no handler for event type ingest\.something-else/);
      assert.equal((unknown.payload as { id: string }).id, 'evt-9', 'the event is kept whole for a replay');
      const errors = await t.sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${t.schema}".job_errors WHERE category IN ('validation', 'unknown-type')`);
      assert.equal(errors[0]?.n, bad.length + 1, 'each dead letter has its reason in the job history');
      assert.equal(ingested.reduce((n, i) => n + i.deadLettered, 0), bad.length + 2);
      assert.deepEqual(await effects(t), []);
    });

    it('while the database refuses, nothing is acked; when it accepts again everything is stored and acked; stop gives back what was not stored', async () => {
      const t = await db.open();
      const { source, consumer } = await shippingGroup(t);
      await t.sql(`CREATE TABLE "${t.schema}".outage (on_ boolean NOT NULL)`);
      await t.sql(`INSERT INTO "${t.schema}".outage VALUES (true)`);
      await t.sql(`CREATE FUNCTION "${t.schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF (SELECT on_ FROM "${t.schema}".outage) THEN RAISE EXCEPTION 'simulated outage'; END IF;
          IF NEW.payload->>'id' = 'poison' THEN RAISE EXCEPTION 'value refused' USING ERRCODE = '22023'; END IF;
          RETURN NEW;
        END $$`);
      await t.sql(`CREATE TRIGGER refuse BEFORE INSERT ON "${t.schema}".jobs FOR EACH ROW EXECUTE FUNCTION "${t.schema}".refuse()`);
      const errors: unknown[] = [];
      consumer.on('error', (e) => errors.push(e));
      const settled: string[] = [];
      const pushes = ['order-1', 'poison', 'order-2'].map((id) => source.push(foreignEvent(id, { order: id })).then((r) => settled.push(`${id}:${r}`)));
      while (errors.length < 2) await new Promise((r) => setTimeout(r, 20));
      assert.deepEqual(settled, [], 'nothing acked while the database refuses');
      assert.match(String(errors[0]), /simulated outage/);
      const done = waitForEvents(consumer.worker, 'completed', 2);
      await t.sql(`UPDATE "${t.schema}".outage SET on_ = false`);
      await Promise.all(pushes);
      await done;
      assert.deepEqual(settled.sort(), ['order-1:ack', 'order-2:ack', 'poison:ack']);
      assert.deepEqual((await effects(t)).sort(), ['order-1', 'order-2'], 'the batch around the refused message was stored');
      const poison = (await jobsOf(t)).find((j) => j.state === 'dead')!;
      assert.equal(poison.dead_reason, 'validation');
      assert.match(poison.last_error!.message, /PostgreSQL refused to store the message \(value refused\)/);
      // Refusing again: a message in hand at stop goes back to the source.
      await t.sql(`UPDATE "${t.schema}".outage SET on_ = true`);
      const inHand = source.push(foreignEvent('order-3', { order: '3' }));
      while (errors.length < 3) await new Promise((r) => setTimeout(r, 20));
      await consumer.stop();
      assert.equal(await inHand, 'nack');
      assert.equal(source.stopped, true);
    });

    it('a group with a source is left alone by the internal fan-out, so an event is not delivered to it twice', async () => {
      const t = await db.open();
      const { consumer } = await shippingGroup(t);
      await t.mailroom.publish(shipped, { order: 'internal' });
      const relay = t.mailroom.relay();
      await flushUntil(relay, 1);
      assert.equal((await jobsOf(t)).length, 0);
      await consumer.stop();
    });

    it('a group with a source makes no internal cursor: a relay without the internal target prunes what it delivered and reports no internal backlog', async () => {
      const t = await db.open();
      const { consumer } = await shippingGroup(t);
      await t.mailroom.publish(shipped, { order: 'A-1' });
      await t.mailroom.publish(shipped, { order: 'A-2' });
      const sent: string[] = [];
      const relay = t.mailroom.relay({ internal: false, to: [{ name: 'broker', publish: async (events) => void sent.push(...events.map((e) => e.position)) }], retention: 0 });
      await flushUntil(relay, 2, 'broker');
      assert.equal(sent.length, 2);
      const stats = await t.mailroom.stats();
      assert.deepEqual(Object.keys(stats.relay), ['broker'], 'only the target that runs has a cursor');
      assert.equal(stats.relay.broker!.unpublished, 0);
      // Before: the group's registration made an `internal` cursor that never moved, which kept every event.
      assert.deepEqual(await relay.prune(), { events: 2, parked: 0 });
      await relay.stop();
      await consumer.stop();
    });

    it('refuses bad source options with an error naming the option', async () => {
      const t = await db.open();
      const handlers = { [shipped.type]: async () => {} };
      assert.throws(() => t.mailroom.consumer({ group: 'g', source: scriptedSource(), from: 'earliest', handlers }), (e: unknown) => e instanceof ValidationError && /from applies to internal events/.test(e.message));
      assert.throws(() => t.mailroom.consumer({ group: 'g', source: { kind: 'x' } as never, handlers }), (e: unknown) => e instanceof ValidationError && e.issues[0]?.path === 'source');
      assert.throws(() => t.mailroom.consumer({ group: 'g', source: scriptedSource(), maxMessageBytes: 0, handlers }), (e: unknown) => e instanceof ValidationError && /maxMessageBytes/.test(e.message));
    });

    itPlans(db, 'storing a batch probes the primary key for each message already stored, even on statistics taken while the table was small', async (t, session) => {
      const jobs = `"${t.schema}".jobs`;
      const insertJobs = (n: number) =>
        session.query(`INSERT INTO ${jobs} (id, queue, type, state, max_attempts, payload) SELECT gen_random_uuid(), 'consumer.g', 'x.y', 'completed', 5, '{}' FROM generate_series(1, ${n})`);
      // Statistics taken with 10 jobs, then 20,000 more (a group's completed history): the planner believes there are a handful.
      await insertJobs(10);
      await session.query(`ANALYZE ${jobs}`);
      await insertJobs(20_000);
      const [stored] = (await session.query<{ id: string }>(`SELECT id FROM ${jobs} LIMIT 1`)).rows;
      const ids = [stored!.id, ...Array.from({ length: 199 }, () => crypto.randomUUID())];
      const envelope = JSON.stringify({ specversion: '1.0', id: 'e', type: 'x.y', data: { n: 1 } });
      const args = [sqlArray(ids), sqlArray(ids.map(() => 'x.y')), sqlArray(ids.map((_, i) => `k${i}`)), sqlArray(ids.map(() => null)), sqlArray(ids.map(() => envelope)), "'consumer.g'", '5', 'NULL', '10', '30000', "'w'"].join(', ');
      const { text } = ingestQueries(`"${t.schema}"`).storeEvents;
      for (const mode of PLAN_MODES) {
        await session.query('BEGIN');
        const plan = await explainPrepared(session, mode, 'store', text, args);
        await session.query('ROLLBACK');
        assert.match(plan, /Tuples Inserted: 199\b/, `${mode}: the message already stored is skipped, the others stored:\n${plan}`);
        // Before: a hash anti-join over every job of the table (all 20,010 rows) for each batch.
        assert.doesNotMatch(plan, /Seq Scan on jobs|Hash/, `${mode}:\n${plan}`);
        assert.match(plan, /Index (Only )?Scan using jobs_pkey on jobs k .*loops=200\)/, `${mode}: one primary-key probe per message:\n${plan}`);
      }
    });
  });
}
