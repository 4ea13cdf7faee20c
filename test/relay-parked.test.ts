/**
 * Events a relay target refuses for good (RefusedEventError): parked by
 * default, with the events after them delivered; held with
 * `onRefused: 'hold'`; a refusal naming an event the target was not given is
 * a failed round. The real brokers' cases: an event over NATS's max_payload,
 * over RabbitMQ's max_message_size (more NATS cases are in nats.test.ts).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { defineEvent, RefusedEventError, ValidationError, type Mailroom, type ParkedEvent, type Relay, type RelayContext, type RelayedEvent, type RelayTarget } from '../src/index.ts';
import { nats } from '../src/brokers/nats/index.ts';
import { rabbitmq } from '../src/brokers/rabbitmq/index.ts';
import { testDatabases, type TestMailroom } from './helpers/databases.ts';
import { withJsm } from './helpers/brokers/nats.ts';
import { withConnection } from './helpers/brokers/rabbitmq.ts';
import { PrivateRabbitNode } from './helpers/brokers/private-rabbitmq.ts';
import { flushUntil } from './helpers/relay.ts';
import { eventually } from './helpers/events.ts';

const NATS_URL = process.env.NATS_URL;
const RABBITMQ_URL = process.env.RABBITMQ_URL;

const happened = defineEvent<{ n: number }>('parked.happened', { version: 1 });
const sized = defineEvent<{ n: number; pad: string }>('parked.sized', { version: 1 });

const modes = [
  { name: "in the round's transaction", readAhead: false, pipelined: false },
  { name: 'read ahead', readAhead: true, pipelined: false },
  { name: 'read ahead and pipelined', readAhead: true, pipelined: true },
] as const;

type Mode = (typeof modes)[number];

/**
 * A target that refuses every batch holding an event whose n is in `poison`
 * (before storing anything of it), and stores the others' n in order.
 */
function refusing(mode: Mode, poison: Set<number>, name = 'picky'): RelayTarget & { got: number[]; offered: Set<number> } {
  const got: number[] = [];
  const offered = new Set<number>();
  let lastId: string | null = null;
  return {
    name,
    readAhead: mode.readAhead,
    pipelined: mode.pipelined,
    got,
    offered,
    async publish(events: readonly RelayedEvent[], context: RelayContext) {
      for (const e of events) offered.add((e.envelope.data as { n: number }).n);
      // A pipelined target stores a batch sent ahead only behind the event named `after` (RelayContext.after).
      if (context.after !== undefined && lastId !== context.after.envelope.id) throw new Error('sent ahead of the batch before it: refused, sent again later');
      const bad = events.find((e) => poison.has((e.envelope.data as { n: number }).n));
      if (bad) throw new RefusedEventError(bad.envelope.id, `n=${(bad.envelope.data as { n: number }).n} is too large for picky`);
      got.push(...events.map((e) => (e.envelope.data as { n: number }).n));
      lastId = events.at(-1)!.envelope.id;
    },
  };
}

async function publishRange(mailroom: Mailroom, from: number, to: number): Promise<void> {
  const items = [];
  for (let n = from; n <= to; n++) items.push({ n });
  await mailroom.publishMany(happened, items);
}

/**
 * The error of the first flush that fails. On a shared PostgreSQL server another test's open
 * transaction can hold the relay's fence for a moment: a flush then delivers nothing and resolves
 * (held back), and this flushes again.
 */
async function flushFailure(relay: Relay, timeoutMs = 15_000): Promise<Error> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const outcome = await relay.flush().then(
      (result) => result,
      (error: unknown) => error,
    );
    if (outcome instanceof Error) return outcome;
    if (Date.now() > deadline) throw new Error(`no flush failed within ${timeoutMs} ms; the last one returned ${JSON.stringify(outcome)}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function parkedRows(t: TestMailroom): Promise<{ target: string; type: string; reason: string; n: number; event_id: string }[]> {
  return t.sql(
    `SELECT target, type, reason, (body::jsonb -> 'data' ->> 'n')::int AS n, event_id FROM "${t.schema}".relay_parked ORDER BY position`,
  );
}

/**
 * Flushes `relay` until `count` events are parked, for up to 15 s: a round may find the events
 * behind another test's open transaction (the outbox fence) and deliver nothing for a while, so a
 * number of flushes alone (50 took under 0.2 s in a CI run) is no bound.
 */
async function flushUntilParked(relay: Relay, t: TestMailroom, count: number): Promise<void> {
  for (const deadline = Date.now() + 15_000; (await parkedRows(t)).length < count && Date.now() < deadline; ) {
    await relay.flush();
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

for (const db of testDatabases()) {
  describe(`events a relay target refuses, on ${db.name}`, () => {
    for (const mode of modes) {
      it(`${mode.name}: a refused event is parked with its reason and envelope, the events after it are delivered in order, and no later relay sends it again`, async () => {
        const t = await db.open();
        const { mailroom } = t;
        await publishRange(mailroom, 1, 6);
        const target = refusing(mode, new Set([3]));
        const relay = mailroom.relay({ internal: false, to: [target], batchSize: 4 });
        const parked: ParkedEvent[] = [];
        const lifecycle: ParkedEvent[] = [];
        relay.on('parked', (info) => parked.push(info));
        mailroom.on('relay.parked', (info) => lifecycle.push(info));
        await flushUntil(relay, 5, target.name, 15_000, mailroom);
        assert.deepEqual(target.got, [1, 2, 4, 5, 6]);

        const rows = await parkedRows(t);
        assert.equal(rows.length, 1);
        assert.deepEqual({ ...rows[0], event_id: undefined }, { target: 'picky', type: 'parked.happened', reason: 'n=3 is too large for picky', n: 3, event_id: undefined });
        assert.equal(parked.length, 1);
        assert.deepEqual(parked[0], { target: 'picky', eventId: rows[0]!.event_id, type: 'parked.happened', position: parked[0]!.position, reason: 'n=3 is too large for picky' });
        assert.deepEqual(lifecycle, parked, 'mailroom.on(relay.parked) gets the same');
        const stats = (await mailroom.stats()).relay.picky!;
        assert.equal(stats.parked, 1);
        assert.equal(stats.unpublished, 0, 'the cursor passed the parked event');

        // Two more events, a new relay and a new target object: the parked event is not offered again.
        await relay.stop();
        await publishRange(mailroom, 7, 8);
        const later = refusing(mode, new Set([3]));
        const second = mailroom.relay({ internal: false, to: [later], batchSize: 4 });
        await flushUntil(second, 2, later.name, 15_000, mailroom);
        await second.stop();
        assert.deepEqual(later.got, [7, 8]);
        assert.ok(!later.offered.has(3));
        assert.equal((await parkedRows(t)).length, 1);
      });
    }

    it('parkedEvents: list shows what is parked, republish refused again keeps it with the new reason, republish once fixed delivers it in outbox order and unparks it, discard deletes', async () => {
      const t = await db.open();
      const { mailroom } = t;
      await publishRange(mailroom, 1, 6);
      const poison = new Set([2, 5]);
      const target = refusing(modes[0], poison);
      const relay = mailroom.relay({ internal: false, to: [target], batchSize: 10 });
      await flushUntil(relay, 4, target.name, 15_000, mailroom);
      await relay.stop();
      assert.deepEqual(target.got, [1, 3, 4, 6]);

      const listed = await mailroom.parkedEvents.list();
      assert.deepEqual(
        listed.map((p) => [p.target, p.type, p.reason]),
        [
          ['picky', 'parked.happened', 'n=2 is too large for picky'],
          ['picky', 'parked.happened', 'n=5 is too large for picky'],
        ],
      );
      assert.ok(listed.every((p) => p.bytes > 100 && p.parkedAt instanceof Date && p.parkedBy === relay.id && p.eventId.length > 0));
      assert.ok(BigInt(listed[0]!.position) < BigInt(listed[1]!.position));
      assert.deepEqual(await mailroom.parkedEvents.list({ target: 'other' }), []);
      assert.equal((await mailroom.parkedEvents.list({ target: 'picky', limit: 1 })).length, 1);

      // Still refused: both stay parked, with the target's latest reason.
      const again = refusing(modes[0], poison);
      const first = await mailroom.parkedEvents.republish(again);
      assert.deepEqual(first.republished, []);
      assert.deepEqual(
        first.refused.map((r) => r.reason),
        ['n=2 is too large for picky', 'n=5 is too large for picky'],
      );
      assert.equal((await parkedRows(t)).length, 2);

      // One chosen by id, once the cause is fixed; then the rest.
      poison.clear();
      const fixed = refusing(modes[0], poison);
      const one = await mailroom.parkedEvents.republish(fixed, { eventIds: [listed[1]!.eventId] });
      assert.deepEqual(one, { republished: [listed[1]!.eventId], refused: [] });
      assert.deepEqual(fixed.got, [5]);
      const rest = await mailroom.parkedEvents.republish(fixed);
      assert.deepEqual(rest, { republished: [listed[0]!.eventId], refused: [] });
      assert.deepEqual(fixed.got, [5, 2]);
      assert.deepEqual(await mailroom.parkedEvents.list(), []);
      assert.equal((await mailroom.stats()).relay.picky!.parked, 0);

      // Discard: by id and all; nothing is published.
      await publishRange(mailroom, 7, 9);
      const third = mailroom.relay({ internal: false, to: [refusing(modes[0], new Set([7, 8, 9]))], batchSize: 10 });
      await flushUntil(third, 0, 'picky', 15_000, mailroom);
      await flushUntilParked(third, t, 3);
      await third.stop();
      const three = await mailroom.parkedEvents.list({ target: 'picky' });
      assert.equal(three.length, 3);
      assert.deepEqual(await mailroom.parkedEvents.discard('picky', { eventIds: [three[0]!.eventId] }), { discarded: [three[0]!.eventId] });
      assert.deepEqual((await mailroom.parkedEvents.discard('picky', { all: true })).discarded.sort(), [three[1]!.eventId, three[2]!.eventId].sort());
      assert.deepEqual(await mailroom.parkedEvents.list(), []);
    });

    it('parkedEvents: a republish that fails for another reason stops there and leaves it and the rest parked; bad arguments are refused naming the problem', async () => {
      const t = await db.open();
      const { mailroom } = t;
      await publishRange(mailroom, 1, 3);
      const relay = mailroom.relay({ internal: false, to: [refusing(modes[0], new Set([1, 2, 3]))], batchSize: 10 });
      await flushUntilParked(relay, t, 3);
      await relay.stop();
      assert.equal((await parkedRows(t)).length, 3);

      let calls = 0;
      const down: RelayTarget = {
        name: 'picky',
        async publish() {
          calls++;
          if (calls === 2) throw new Error('broker unreachable');
        },
      };
      await assert.rejects(mailroom.parkedEvents.republish(down), (error: Error) =>
        /parkedEvents.republish: publishing parked event \S+ to picky failed: broker unreachable; 1 were republished before it, it and the rest stay parked/.test(error.message),
      );
      assert.deepEqual((await parkedRows(t)).map((r) => r.n), [2, 3]);

      const bad = async (call: Promise<unknown>, path: string, message: RegExp) =>
        assert.rejects(call, (error: unknown) => error instanceof ValidationError && error.issues[0]?.path === path && message.test(error.message));
      await bad(mailroom.parkedEvents.list({ limit: 0 }), 'limit', /limit must be an integer from 1 to 10000, got 0/);
      await bad(mailroom.parkedEvents.list({ target: '' }), 'target', /the target must be a relay target's name/);
      await bad(mailroom.parkedEvents.discard('picky', {} as never), 'eventIds', /say which parked events of picky to delete: \{ eventIds: \[\.\.\.\] \}, or \{ all: true \}/);
      await bad(mailroom.parkedEvents.discard('picky', { eventIds: [] }), 'eventIds', /eventIds must be a non-empty array of event ids/);
      await bad(mailroom.parkedEvents.discard('picky', { all: 'yes' } as never), 'eventIds', /say which parked events/);
      await bad(mailroom.parkedEvents.republish({ name: 'picky' } as never), 'target', /target must be a relay target \(an object with name and publish\)/);
      await bad(mailroom.parkedEvents.republish(down, { eventIds: [7] as never }), 'eventIds', /eventIds must be a non-empty array/);
      assert.equal((await parkedRows(t)).length, 2, 'nothing deleted by the refused calls');
    });

    it("the mailroom's logger writes a parked event as an error line naming the target, the event and the reason", async () => {
      const lines: { fields: Record<string, unknown>; message: string }[] = [];
      const sink = (fields: Record<string, unknown>, message: string) => void lines.push({ fields, message });
      const { mailroom } = await db.open({ logger: { error: sink, warn: () => {}, info: () => {} } });
      await publishRange(mailroom, 1, 2);
      const target = refusing(modes[0], new Set([1]));
      const relay = mailroom.relay({ internal: false, to: [target] });
      await flushUntil(relay, 1, target.name, 15_000, mailroom);
      await relay.stop();
      const parked = lines.filter((l) => /refused for good and parked/.test(l.message));
      assert.equal(parked.length, 1);
      assert.match(parked[0]!.message, /^relay picky: event [0-9a-f-]+ \(parked\.happened\) refused for good and parked: n=1 is too large for picky$/);
      assert.deepEqual(Object.keys(parked[0]!.fields).sort(), ['eventId', 'eventType', 'position', 'reason', 'target']);
    });

    it('a parked event the relay meets again after a crash (its cursor had not moved past it) is left out, not refused twice', async () => {
      const t = await db.open();
      const { mailroom } = t;
      await publishRange(mailroom, 1, 3);
      const target = refusing(modes[0], new Set([2]));
      const relay = mailroom.relay({ internal: false, to: [target], batchSize: 10 });
      await flushUntil(relay, 2, target.name, 15_000, mailroom);
      await relay.stop();
      // As if the relay had died after parking event 2, before delivering the rest: the cursor goes back.
      await t.sql(`UPDATE "${t.schema}".relay_cursors SET cursor_xid = '0', cursor_position = 0 WHERE target = 'picky'`);
      const again = refusing(modes[0], new Set([2]));
      const second = mailroom.relay({ internal: false, to: [again], batchSize: 10 });
      let refusedAgain = 0;
      second.on('parked', () => refusedAgain++);
      await flushUntil(second, 2, again.name, 15_000, mailroom);
      await second.stop();
      assert.deepEqual(again.got, [1, 3], 'delivered again (consumers deduplicate), without the parked event');
      assert.ok(!again.offered.has(2));
      assert.equal(refusedAgain, 0);
    });

    it('a relay that cannot read the parked list when it takes the lease reports why and still delivers; the parked record stays', async () => {
      const t = await db.open();
      const { mailroom } = t;
      await publishRange(mailroom, 1, 3);
      const relay = mailroom.relay({ internal: false, to: [refusing(modes[0], new Set([2]))], batchSize: 10 });
      await flushUntil(relay, 2, 'picky', 15_000, mailroom);
      await relay.stop();
      // The cursor goes back (as after a crash), and the parked list cannot be read: its table is gone for a while.
      await t.sql(`UPDATE "${t.schema}".relay_cursors SET cursor_xid = '0', cursor_position = 0 WHERE target = 'picky'`);
      await t.sql(`ALTER TABLE "${t.schema}".relay_parked RENAME TO relay_parked_away`);
      const accepting = refusing(modes[0], new Set());
      const second = mailroom.relay({ internal: false, to: [accepting], batchSize: 10 });
      const errors: Error[] = [];
      second.on('error', (error) => void errors.push(error instanceof Error ? error : new Error(String(error))));
      try {
        await flushUntil(second, 3, accepting.name, 15_000, mailroom);
      } finally {
        await second.stop();
        await t.sql(`ALTER TABLE "${t.schema}".relay_parked_away RENAME TO relay_parked`);
      }
      assert.ok(
        errors.some((e) => /relay_parked/.test(e.message)),
        `the failed read is reported: ${errors.map((e) => e.message).join('; ')}`,
      );
      assert.deepEqual(accepting.got, [1, 2, 3], 'every event delivered: without the list, the parked one is offered again (and this target takes it)');
      assert.deepEqual((await parkedRows(t)).map((r) => r.n), [2], 'the parked record is kept');
    });

    it("onRefused: 'hold' retries the refused event and delivers nothing after it to that target until the cause is fixed; nothing is parked", async () => {
      const t = await db.open();
      const { mailroom } = t;
      await publishRange(mailroom, 1, 4);
      const poison = new Set([2]);
      const target = refusing(modes[0], poison);
      const relay = mailroom.relay({ internal: false, to: [target], batchSize: 1, onRefused: 'hold' });
      assert.match(
        (await flushFailure(relay)).message,
        /relay target picky refused event [0-9a-f-]+ \(position \d+\): n=2 is too large for picky; with onRefused: 'hold' the relay retries it and delivers nothing after it/,
      );
      assert.match((await flushFailure(relay)).message, /onRefused: 'hold'/, 'still refused: still held');
      assert.deepEqual(target.got, [1]);
      assert.deepEqual(await parkedRows(t), []);
      assert.equal((await mailroom.stats()).relay.picky!.unpublished, 3);
      poison.clear(); // the cause fixed (the broker's limit raised, say)
      await flushUntil(relay, 3, target.name, 15_000, mailroom);
      assert.deepEqual(target.got, [1, 2, 3, 4]);
      await relay.stop();
    });

    it('a RefusedEventError naming an event the target was not given is a failed round, retried; nothing is parked', async () => {
      const t = await db.open();
      const { mailroom } = t;
      await publishRange(mailroom, 1, 2);
      let fixed = false;
      const got: number[] = [];
      const confused: RelayTarget = {
        name: 'confused',
        async publish(events) {
          if (!fixed) throw new RefusedEventError('not-an-event-of-this-batch', 'refused by mistake');
          got.push(...events.map((e) => (e.envelope.data as { n: number }).n));
        },
      };
      const relay = mailroom.relay({ internal: false, to: [confused] });
      assert.match(
        (await flushFailure(relay)).message,
        /relay target confused refused event not-an-event-of-this-batch, which is not in the batch it was given \(2 events from position \d+\); the batch is retried/,
      );
      assert.deepEqual(await parkedRows(t), []);
      fixed = true;
      await flushUntil(relay, 2, 'confused', 15_000, mailroom);
      assert.deepEqual(got, [1, 2]);
      await relay.stop();
    });

    it("a real NATS server: an event over its max_payload is parked with the server's reason, and the events after it reach the stream", { skip: !NATS_URL && 'set NATS_URL' }, async () => {
      const t = await db.open();
      const { mailroom } = t;
      const stream = `mr-parked-${process.pid}-${Date.now().toString(36)}`;
      // The default maxPayloadBytes (1 MiB) lets publish accept a payload the server's max_payload (1 MB) cannot carry.
      await mailroom.publishMany(sized, [{ n: 1, pad: '' }, { n: 2, pad: 'x'.repeat(1_048_400) }, { n: 3, pad: '' }, { n: 4, pad: '' }]);
      const target = nats({ url: NATS_URL!, stream });
      const relay = mailroom.relay({ internal: false, to: [target] });
      relay.on('warning', () => {}); // nats-max-payload says this in advance
      try {
        await flushUntil(relay, 3, target.name, 15_000, mailroom);
        const rows = await parkedRows(t);
        assert.equal(rows.length, 1);
        assert.equal(rows[0]!.n, 2);
        assert.match(rows[0]!.reason, /^nats: the message is larger than the server's max_payload/);
        const stored = await withJsm(NATS_URL!, async (jsm) => {
          const info = await jsm.streams.info(stream);
          const ns: number[] = [];
          for (let seq = info.state.first_seq; seq <= info.state.last_seq; seq++) {
            const m = await jsm.streams.getMessage(stream, { seq });
            if (m) ns.push((JSON.parse(new TextDecoder().decode(m.data)) as { data: { n: number } }).data.n);
          }
          return ns;
        });
        assert.deepEqual(stored, [1, 3, 4]);
        assert.equal((await mailroom.stats()).relay[target.name]!.parked, 1);
      } finally {
        await relay.stop();
        await withJsm(NATS_URL!, (jsm) => jsm.streams.delete(stream)).catch(() => undefined);
      }
    });

    it(
      "a real RabbitMQ server: an event over its max_message_size is parked with the broker's reason, and the events after it reach the exchange",
      { skip: (!RABBITMQ_URL && 'set RABBITMQ_URL') || (db.name !== 'pglite' && 'the broker side is the same on every database: run once') },
      async () => {
        const t = await db.open({ maxPayloadBytes: 4 * 1024 * 1024 });
        const { mailroom } = t;
        const exchange = `mr-parked-${process.pid}-${Date.now().toString(36)}`;
        await mailroom.publishMany(sized, [{ n: 1, pad: '' }, { n: 2, pad: 'x'.repeat(3_000_000) }, { n: 3, pad: '' }, { n: 4, pad: '' }]);
        // A private node: lowering max_message_size on the shared server would reach every test file using it.
        const node = await PrivateRabbitNode.start();
        const setMaxMessageSize = (bytes: number) => node.ctl('eval', `application:set_env(rabbit, max_message_size, ${bytes}).`);
        const target = rabbitmq({ url: node.url, exchange });
        const relay = mailroom.relay({ internal: false, to: [target] });
        try {
          await withConnection(async (connection) => {
            const channel = await connection.createChannel();
            await channel.assertExchange(exchange, 'topic', { durable: true });
            const { queue } = await channel.assertQueue('', { exclusive: true });
            await channel.bindQueue(queue, exchange, '#');
            // Lowered for channels opened from now on: the target's opens after it.
            const defaultMaxMessageSize = (await node.ctl('eval', 'application:get_env(rabbit, max_message_size).')).trim();
            await setMaxMessageSize(2 * 1024 * 1024);
            try {
              await flushUntil(relay, 3, target.name, 30_000, mailroom);
            } finally {
              await setMaxMessageSize(Number(/\d+/.exec(defaultMaxMessageSize)![0]));
              await relay.stop();
            }
            const rows = await parkedRows(t);
            assert.equal(rows.length, 1);
            assert.equal(rows[0]!.n, 2);
            assert.match(rows[0]!.reason, /^rabbitmq: its message of 3\d{6} bytes is larger than the broker's max_message_size \(2097152 bytes\)/);
            const ns: number[] = [];
            for (let message = await channel.get(queue, { noAck: true }); message; message = await channel.get(queue, { noAck: true })) {
              ns.push((JSON.parse(message.content.toString()) as { data: { n: number } }).data.n);
            }
            // Event 1 may have been confirmed before the channel closed, and is then sent again with the rest.
            assert.deepEqual([...new Set(ns)], [1, 3, 4]);
            assert.equal((await mailroom.stats()).relay[target.name]!.parked, 1);

            // The limit back up (the finally above): republishing delivers it and unparks it.
            const again = rabbitmq({ url: node.url, exchange });
            try {
              assert.deepEqual(await mailroom.parkedEvents.republish(again), { republished: [rows[0]!.event_id], refused: [] });
            } finally {
              await again.close();
            }
            const late = await channel.get(queue, { noAck: true });
            assert.ok(late, 'the republished event reached the queue');
            assert.equal((JSON.parse(late.content.toString()) as { data: { n: number } }).data.n, 2);
            assert.deepEqual(await mailroom.parkedEvents.list(), []);
            await channel.deleteExchange(exchange);
          }, node.url);
        } finally {
          await node.stop();
        }
      },
    );

    it("a real NATS stream: an event over its max_msg_size is parked; once the limit is raised, republish stores it and unparks it", { skip: !NATS_URL && 'set NATS_URL' }, async () => {
      const t = await db.open();
      const { mailroom } = t;
      const stream = `mr-parked-msg-${process.pid}-${Date.now().toString(36)}`;
      await withJsm(NATS_URL!, (jsm) => jsm.streams.add({ name: stream, subjects: [`${stream}.>`], max_msg_size: 2_000 }));
      await mailroom.publishMany(sized, [{ n: 1, pad: '' }, { n: 2, pad: 'x'.repeat(3_000) }, { n: 3, pad: '' }]);
      const target = nats({ url: NATS_URL!, stream });
      const relay = mailroom.relay({ internal: false, to: [target] });
      relay.on('warning', () => {}); // nats-max-payload says this in advance
      const storedNs = () =>
        withJsm(NATS_URL!, async (jsm) => {
          const info = await jsm.streams.info(stream);
          const ns: number[] = [];
          for (let seq = info.state.first_seq; seq <= info.state.last_seq && info.state.messages > 0; seq++) {
            const m = await jsm.streams.getMessage(stream, { seq });
            if (m) ns.push((JSON.parse(new TextDecoder().decode(m.data)) as { data: { n: number } }).data.n);
          }
          return ns;
        });
      try {
        await flushUntil(relay, 2, target.name, 15_000, mailroom);
        await relay.stop();
        const rows = await parkedRows(t);
        assert.deepEqual(rows.map((r) => r.n), [2]);
        assert.match(rows[0]!.reason, /max_msg_size/);
        assert.deepEqual(await storedNs(), [1, 3]);

        await withJsm(NATS_URL!, (jsm) => jsm.streams.update(stream, { subjects: [`${stream}.>`], max_msg_size: 10_000 }));
        const again = nats({ url: NATS_URL!, stream });
        try {
          assert.deepEqual(await mailroom.parkedEvents.republish(again), { republished: [rows[0]!.event_id], refused: [] });
        } finally {
          await again.close?.();
        }
        assert.deepEqual(await storedNs(), [1, 3, 2], 'stored after the events that followed it');
        assert.deepEqual(await mailroom.parkedEvents.list(), []);
      } finally {
        await relay.stop();
        await withJsm(NATS_URL!, (jsm) => jsm.streams.delete(stream)).catch(() => undefined);
      }
    });

    it('a relay that lost its lease between the refusal and the park parks nothing; the relay holding the lease next parks it', async () => {
      const t = await db.open();
      const { mailroom } = t;
      await publishRange(mailroom, 1, 3);
      let steals = 0;
      const target: RelayTarget = {
        name: 'picky',
        readAhead: true, // publishes outside the relay's transaction, so this test can write the cursor row meanwhile
        async publish(events) {
          const bad = events.find((e) => (e.envelope.data as { n: number }).n === 2);
          if (!bad) return;
          if (steals === 0) {
            steals++;
            // Another relay takes the lease over (a new fencing token) before this one records the refusal.
            await t.sql(`UPDATE "${t.schema}".relay_cursors SET holder = 'thief', token = token + 1, locked_until = now() - interval '1 second' WHERE target = 'picky'`);
          }
          throw new RefusedEventError(bad.envelope.id, 'n=2 is too large for picky');
        },
      };
      const relay = mailroom.relay({ internal: false, to: [target], batchSize: 10 });
      const parked: ParkedEvent[] = [];
      relay.on('parked', (info) => parked.push(info));
      // Another test's open transaction on the shared server can hold the fence: the flush then
      // delivers nothing without calling the target, so flush again until it was called.
      let first: Awaited<ReturnType<Relay['flush']>> | undefined;
      await eventually(async () => {
        first = await relay.flush();
        return steals > 0;
      }, 15_000, 'a flush that calls the target');
      assert.equal(steals, 1);
      assert.equal(first!.picky!.delivered, 0);
      assert.deepEqual(await parkedRows(t), [], 'the fenced park wrote nothing for the relay that lost its lease');
      assert.deepEqual(parked, []);
      await flushUntil(relay, 2, 'picky', 15_000, mailroom);
      await relay.stop();
      assert.deepEqual((await parkedRows(t)).map((r) => r.n), [2]);
      assert.equal(parked.length, 1);
    });

    it('parked events are deleted after parkedRetention (default 30 days), with their envelopes; younger ones stay', async () => {
      const t = await db.open();
      const insert = (position: number, age: string) =>
        t.sql(
          `INSERT INTO "${t.schema}".relay_parked (target, position, xid, event_id, type, reason, body, holder, parked_at)
           VALUES ('old-target', $1, '1', $2, 'parked.happened', 'too large', '{"data":{"email":"a@example.com"}}', 'test', now() - $3::interval)`,
          [position, `e${position}`, age],
        );
      await insert(1, '31 days');
      await insert(2, '2 hours');
      await insert(3, '10 minutes');
      const byDefault = t.mailroom.relay();
      assert.deepEqual(await byDefault.prune(), { events: 0, parked: 1 }, 'the default keeps 30 days');
      const short = t.mailroom.relay({ parkedRetention: '1h' });
      assert.deepEqual(await short.prune(), { events: 0, parked: 1 });
      const left = await t.sql<{ event_id: string }>(`SELECT event_id FROM "${t.schema}".relay_parked`);
      assert.deepEqual(left.map((r) => r.event_id), ['e3']);
      assert.throws(() => t.mailroom.relay({ parkedRetention: 'forever' as never }), /relay parkedRetention: "forever" is not a duration/);
    });

    it('onRefused must be park or hold', async () => {
      const { mailroom } = await db.open();
      for (const bad of ['skip', '', 1, 'PARK']) {
        assert.throws(() => mailroom.relay({ onRefused: bad as never }), (error: unknown) => error instanceof ValidationError && /relay: onRefused must be 'park' or 'hold', got/.test(error.message) && error.issues[0]?.path === 'onRefused');
      }
    });
  });
}
