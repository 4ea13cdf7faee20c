/**
 * The RabbitMQ adapter (mailroom/rabbitmq) against the real server at
 * RABBITMQ_URL: the relay target, the consumer source, the safety checks, the
 * options, the fixture the shared broker suite uses, and the ceiling benchmark.
 * Two tests change a broker itself, each on a private node of its own (the
 * shared server is in use by other test files meanwhile): one stops and starts
 * the RabbitMQ application (rabbitmqctl stop_app/start_app), one raises a
 * memory alarm for a moment (set_vm_memory_high_watermark) to stall publishing.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { after, afterEach, describe, test } from 'node:test';
import { promisify } from 'node:util';
import type { Channel, ChannelModel, ConsumeMessage, GetMessage } from 'amqplib';
import { ChannelAcks } from '../src/brokers/rabbitmq/channel-acks.ts';
import { ceiling } from '../bench/brokers/rabbitmq-ceiling.ts';
import { rabbitmq, rabbitmqSource, type RabbitMqSource } from '../src/brokers/rabbitmq/index.ts';
import type { SourceContext, SourceMessage } from '../src/brokers/source.ts';
import { CLOUDEVENTS_CONTENT_TYPE, toWireMessage } from '../src/brokers/wire.ts';
import { ValidationError } from '../src/errors.ts';
import type { CloudEventEnvelope } from '../src/events/envelope.ts';
import { newId } from '../src/ids.ts';
import type { RelayContext, RelayedEvent } from '../src/relay/target.ts';
import { eventually } from './helpers/events.ts';
import type { PairDescription } from './helpers/brokers/fixture.ts';
import { fixture, rabbitPair, withConnection } from './helpers/brokers/rabbitmq.ts';
import { PrivateRabbitNode } from './helpers/brokers/private-rabbitmq.ts';

const url = process.env.RABBITMQ_URL;
const skip = !url && 'set RABBITMQ_URL';
const run = promisify(execFile);

let counter = 0;
/** A unique name for this run: `t-<pid>-<n>-<what>`. */
const unique = (what: string) => `t-${process.pid}-${++counter}-${what}`;

/** Exchanges and queues made by a test, deleted at the end of the file. */
const made = { exchanges: new Set<string>(), queues: new Set<string>() };
after(async () => {
  if (!url) return;
  await withConnection(async (connection) => {
    for (const q of made.queues) await onChannel(connection, (c) => c.deleteQueue(q)).catch(() => {});
    for (const x of made.exchanges) await onChannel(connection, (c) => c.deleteExchange(x)).catch(() => {});
  }, url);
});

/** Runs `fn` on a channel of its own (a failed declare closes only that one). */
async function onChannel<T>(connection: ChannelModel, fn: (channel: Channel) => Promise<T>): Promise<T> {
  const channel = await connection.createChannel();
  channel.on('error', () => {});
  try {
    return await fn(channel);
  } finally {
    await channel.close().catch(() => {});
  }
}

async function admin<T>(fn: (channel: Channel) => Promise<T>, brokerUrl = url!): Promise<T> {
  return await withConnection((connection) => onChannel(connection, fn), brokerUrl);
}

/** A durable topic exchange and a queue bound to it (made on the shared server = cleaned up at the end). */
async function exchangeWithQueue(what: string, queueArgs: Record<string, unknown> = { 'x-queue-type': 'quorum' }, bindingKey = '#', brokerUrl = url!): Promise<{ exchange: string; queue: string }> {
  const exchange = unique(`${what}-x`);
  const queue = unique(`${what}-q`);
  if (brokerUrl === url) {
    made.exchanges.add(exchange);
    made.queues.add(queue);
  }
  await admin(async (c) => {
    await c.assertExchange(exchange, 'topic', { durable: true });
    await c.assertQueue(queue, { durable: true, arguments: queueArgs });
    await c.bindQueue(queue, exchange, bindingKey);
  }, brokerUrl);
  return { exchange, queue };
}

/** Takes every ready message off a queue (no ack needed). */
async function drainQueue(queue: string, brokerUrl = url!): Promise<GetMessage[]> {
  return await admin(async (c) => {
    const out: GetMessage[] = [];
    for (;;) {
      const m = await c.get(queue, { noAck: true });
      if (m === false) return out;
      out.push(m);
    }
  }, brokerUrl);
}

/** Headers without the ones RabbitMQ adds (a quorum queue's `x-delivery-count`). */
const withoutBrokerHeaders = (headers: Record<string, unknown> | undefined) => Object.fromEntries(Object.entries(headers ?? {}).filter(([k]) => !k.startsWith('x-')));

const readyCount = (queue: string) => admin(async (c) => (await c.checkQueue(queue)).messageCount);

function envelope(i: number, extra: Partial<CloudEventEnvelope> = {}): CloudEventEnvelope {
  const type = extra.type ?? 'order.created';
  return {
    specversion: '1.0',
    id: newId(),
    source: 'mailroom://test',
    type,
    time: new Date().toISOString(),
    datacontenttype: 'application/json',
    dataschema: `urn:mailroom:${type}:v1`,
    data: { i },
    ...extra,
  };
}

function relayed(envelopes: CloudEventEnvelope[]): RelayedEvent[] {
  return envelopes.map((e, i) => ({ position: String(i + 1), xid: '1', envelope: e }));
}

/** Brokers ignore the relay's transaction. */
const context = { tx: null } as unknown as RelayContext;

/** A source context recording what the source reports. */
function sourceContext(group = 'billing'): SourceContext & { reports: unknown[]; warnings: unknown[] } {
  const reports: unknown[] = [];
  const warnings: unknown[] = [];
  return { group, handlerTimeoutMs: null, reports, warnings, report: (e) => reports.push(e), warn: (w) => warnings.push(w) };
}

/** Sources a test started: stopped after each test, even a failed one (stop is idempotent). */
const started = new Set<RabbitMqSource>();
afterEach(async () => {
  for (const source of started) await source.stop();
  started.clear();
});

/** Starts a source collecting its messages. */
async function collect(source: RabbitMqSource, ctx = sourceContext()): Promise<{ messages: SourceMessage[]; ctx: ReturnType<typeof sourceContext> }> {
  const messages: SourceMessage[] = [];
  started.add(source);
  await source.start((m) => messages.push(m), ctx);
  return { messages, ctx };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const bodyId = (m: SourceMessage) => (JSON.parse(String(typeof m.body === 'string' ? m.body : Buffer.from(m.body).toString('utf8'))) as { id: string }).id;

describe('rabbitmq target', { skip }, () => {
  test('publishes a batch in order, persistent, with message id, content type, type, correlation id, timestamp and headers; resolves after the confirms', async () => {
    const { exchange, queue } = await exchangeWithQueue('props');
    const target = rabbitmq({ url: url!, exchange });
    try {
      const envelopes = Array.from({ length: 50 }, (_, i) =>
        envelope(i, {
          type: i % 2 === 0 ? 'order.created' : 'order.paid',
          dataschema: `urn:mailroom:${i % 2 === 0 ? 'order.created' : 'order.paid'}:v1`,
          subject: `order-${i % 3}`,
          partitionkey: `order-${i % 3}`,
          correlationid: `req-${i}`,
          causationid: `cmd-${i}`,
          traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
        }),
      );
      await target.publish(relayed(envelopes), context);
      // Confirmed means enqueued: every message is there as soon as publish resolves.
      assert.equal(await readyCount(queue), 50);
      const got = await drainQueue(queue);
      assert.deepEqual(
        got.map((m) => m.properties.messageId),
        envelopes.map((e) => e.id),
        'the order of the batch is kept on the wire',
      );
      for (const [i, m] of got.entries()) {
        const e = envelopes[i]!;
        const wire = toWireMessage(e);
        assert.equal(m.fields.routingKey, e.type, 'routing key = event type');
        assert.equal(m.properties.deliveryMode, 2, 'persistent');
        assert.equal(m.properties.contentType, CLOUDEVENTS_CONTENT_TYPE);
        assert.equal(m.properties.type, e.type);
        assert.equal(m.properties.correlationId, e.correlationid);
        assert.equal(m.properties.timestamp, Math.floor(Date.parse(e.time) / 1000));
        assert.deepEqual(withoutBrokerHeaders(m.properties.headers), wire.headers);
        assert.deepEqual(Object.keys(wire.headers).sort(), ['causationid', 'correlationid', 'partitionkey', 'traceparent']);
        assert.ok(m.content.equals(wire.body), 'body = the structured-mode document');
      }
      assert.equal(target.name, `rabbitmq:${exchange}`);
      assert.equal(target.unroutableCount, 0);
    } finally {
      await target.close();
    }
  });

  test('routingKey(envelope) overrides the routing key; an event without correlation id has none', async () => {
    const { exchange, queue } = await exchangeWithQueue('rk', { 'x-queue-type': 'quorum' }, 'keyed.#');
    const target = rabbitmq({ url: url!, exchange, routingKey: (e) => `keyed.${e.subject ?? 'none'}` });
    try {
      await target.publish(relayed([envelope(1, { subject: 'a1' }), envelope(2)]), context);
      const got = await drainQueue(queue);
      assert.deepEqual(got.map((m) => m.fields.routingKey), ['keyed.a1', 'keyed.none']);
      assert.equal(got[1]!.properties.correlationId, undefined);
      assert.deepEqual(withoutBrokerHeaders(got[1]!.properties.headers), {});
    } finally {
      await target.close();
    }
  });

  test('a publisher nack rejects the batch (a full classic queue with x-overflow reject-publish)', async () => {
    const { exchange, queue } = await exchangeWithQueue('nack', { 'x-queue-type': 'classic', 'x-max-length': 2, 'x-overflow': 'reject-publish' });
    const target = rabbitmq({ url: url!, exchange });
    try {
      await target.publish(relayed([envelope(1), envelope(2)]), context);
      await assert.rejects(target.publish(relayed([envelope(3)]), context), /refused event .* \(publisher nack\)/);
      await drainQueue(queue);
      await target.publish(relayed([envelope(4)]), context); // room again: the same target goes on
      assert.equal(await readyCount(queue), 1);
    } finally {
      await target.close();
    }
  });

  test("unroutable events: 'warn' counts them and warns once per routing key; 'fail' rejects the batch", async (t) => {
    const exchange = unique('unroutable-x');
    made.exchanges.add(exchange);
    const warn = t.mock.method(console, 'warn', () => {});
    const target = rabbitmq({ url: url!, exchange }); // declares the exchange; no queue is bound
    const failing = rabbitmq({ url: url!, exchange, unroutable: 'fail' });
    try {
      await target.publish(relayed([envelope(1), envelope(2), envelope(3, { type: 'order.paid' })]), context);
      await target.publish(relayed([envelope(4)]), context);
      assert.equal(target.unroutableCount, 4);
      assert.equal(warn.mock.callCount(), 2, 'once per routing key');
      assert.match(String(warn.mock.calls[0]!.arguments[0]), /routing key 'order.created' are unroutable/);
      await assert.rejects(failing.publish(relayed([envelope(5)]), context), /1 of 1 events were unroutable .*'order.created'/);
      assert.equal(failing.unroutableCount, 0);
    } finally {
      await target.close();
      await failing.close();
    }
  });

  test('publishing to a missing exchange with declare: false rejects and says so', async () => {
    const exchange = unique('nox');
    const target = rabbitmq({ url: url!, exchange, declare: false });
    try {
      await assert.rejects(target.publish(relayed([envelope(1)]), context), new RegExp(`exchange '${exchange}' does not exist`));
    } finally {
      await target.close();
    }
  });

  test('an existing exchange of another type is refused with a hint (declare: true)', async () => {
    const exchange = unique('direct-x');
    made.exchanges.add(exchange);
    await admin((c) => c.assertExchange(exchange, 'direct', { durable: true }));
    const target = rabbitmq({ url: url!, exchange });
    try {
      await assert.rejects(target.publish(relayed([envelope(1)]), context), /exists with other settings than a durable topic exchange.*declare: false/);
    } finally {
      await target.close();
    }
  });

  test('a refused connection names the URL (password hidden)', async () => {
    const target = rabbitmq({ url: 'amqp://app:secret@127.0.0.1:1', exchange: 'x' });
    await assert.rejects(target.publish(relayed([envelope(1)]), context), (error: Error) => {
      assert.match(error.message, /cannot connect to amqp:\/\/app:\*\*\*@127\.0\.0\.1:1.*start RabbitMQ or fix the host and port/);
      assert.doesNotMatch(error.message, /secret/);
      return true;
    });
    await target.close();
  });

  test('a stalled broker (memory alarm: publishers blocked) rejects after confirmTimeout; the next publish succeeds', { timeout: 120_000 }, async () => {
    const node = await PrivateRabbitNode.start();
    const alarms = async () => await node.ctl('eval', 'rabbit_alarm:get_alarms().');
    try {
      const { exchange, queue } = await exchangeWithQueue('stall', undefined, undefined, node.url);
      const target = rabbitmq({ url: node.url, exchange, confirmTimeout: '1s' });
      const watermark = (await node.ctl('eval', 'vm_memory_monitor:get_vm_memory_high_watermark().')).trim();
      assert.match(watermark, /^[\d.]+$/, `cannot read the memory watermark: ${watermark}`);
      try {
        await target.publish(relayed([envelope(0)]), context); // connected before the alarm
        await node.ctl('set_vm_memory_high_watermark', '0');
        await eventually(async () => (await alarms()).includes('memory'), 10_000, 'the memory alarm');
        const started = Date.now();
        await assert.rejects(target.publish(relayed([envelope(1), envelope(2)]), context), /no publisher confirm .* within 1000 ms/);
        const waited = Date.now() - started;
        assert.ok(waited >= 900 && waited < 5000, `rejected after ${waited} ms`);
      } finally {
        await node.ctl('set_vm_memory_high_watermark', watermark);
      }
      try {
        await eventually(async () => !(await alarms()).includes('memory'), 10_000, 'the alarm to clear');
        await target.publish(relayed([envelope(3)]), context);
        const ids = (await drainQueue(queue, node.url)).map((m) => (JSON.parse(m.content.toString()) as { data: { i: number } }).data.i);
        assert.ok(ids.includes(0) && ids.includes(3), `got ${JSON.stringify(ids)}`);
      } finally {
        await target.close();
      }
    } finally {
      await node.stop();
    }
  });
});

describe('rabbitmq source', { skip }, () => {
  test('delivers body, message id, headers and origin; an acked message is not redelivered, an unacked one is after stop', async () => {
    const pair = await fixture.pair(unique('src'));
    const target = pair.target();
    const envelopes = [envelope(1, { correlationid: 'req-1', subject: 'k1', partitionkey: 'k1' }), envelope(2), envelope(3)];
    try {
      await target.publish(relayed(envelopes), context);
      const source = pair.source() as RabbitMqSource;
      const first = await collect(source);
      await eventually(() => first.messages.length === 3, 10_000, '3 deliveries');
      const [m1, m2, m3] = first.messages as [SourceMessage, SourceMessage, SourceMessage];
      assert.equal(m1.messageId, envelopes[0]!.id);
      assert.ok(Buffer.from(m1.body as Uint8Array).equals(toWireMessage(envelopes[0]!).body));
      assert.deepEqual(m1.headers, { correlationid: 'req-1', partitionkey: 'k1', 'content-type': CLOUDEVENTS_CONTENT_TYPE });
      assert.match(m1.origin, new RegExp(`^rabbitmq queue mailroom-test-t-${process.pid}-\\d+-src, delivery 1$`));
      await m1.ack();
      await m3.nack();
      await eventually(() => first.messages.length === 4, 10_000, 'the nacked message back');
      assert.equal(bodyId(first.messages[3]!), envelopes[2]!.id);
      assert.match(first.messages[3]!.origin, /\(redelivered\)$/);
      await source.stop();
      await m2.ack(); // after stop: no throw, no effect
      assert.equal(await pair.pending(), 2, 'm2 and m3 went back to the queue');
      const secondSource = pair.source() as RabbitMqSource;
      const again = await collect(secondSource);
      try {
        await eventually(() => again.messages.length === 2, 10_000, '2 redeliveries');
        assert.deepEqual(again.messages.map((m) => m.messageId).sort(), [envelopes[1]!.id, envelopes[2]!.id].sort(), 'the acked one is not redelivered');
        for (const m of again.messages) await m.ack();
        await sleep(200);
        assert.equal(again.messages.length, 2);
        assert.deepEqual(again.ctx.reports, []);
      } finally {
        await secondSource.stop();
      }
      assert.equal(await pair.pending(), 0);
      await pair.source().stop(); // never started: fine
    } finally {
      await target.close?.();
      await pair.cleanup();
    }
  });

  test('acks given together while an older delivery is held ack only themselves: the held one comes back after stop', async () => {
    const pair = await fixture.pair(unique('held-ack'));
    const target = pair.target();
    const envelopes = Array.from({ length: 6 }, (_, i) => envelope(i));
    try {
      await target.publish(relayed(envelopes), context);
      const source = pair.source() as RabbitMqSource;
      const first = await collect(source);
      await eventually(() => first.messages.length === 6, 10_000, '6 deliveries');
      const [held, ...rest] = first.messages as [SourceMessage, ...SourceMessage[]];
      // As mailroom acks a stored batch: all in one tick, with the first delivery still outstanding.
      await Promise.all(rest.slice(0, 3).map((m) => m.ack()));
      // Then the held one and the last two together: one multiple-ack may now cover every delivery.
      await Promise.all([held.ack(), ...rest.slice(3).map((m) => m.ack())]);
      await source.stop();
      assert.equal(await pair.pending(), 0, 'every delivery acked once, none twice');

      await target.publish(relayed(envelopes.slice(0, 4).map((e) => ({ ...e, id: newId() }))), context);
      const second = pair.source() as RabbitMqSource;
      const again = await collect(second);
      await eventually(() => again.messages.length === 4, 10_000, '4 deliveries');
      const [keep, ...acked] = again.messages as [SourceMessage, ...SourceMessage[]];
      await Promise.all(acked.map((m) => m.ack()));
      await second.stop();
      assert.equal(await pair.pending(), 1, 'the held delivery went back to the queue; the three acked behind it did not take it with them');
      const third = pair.source() as RabbitMqSource;
      const last = await collect(third);
      try {
        await eventually(() => last.messages.length === 1, 10_000, 'the held one again');
        assert.equal(last.messages[0]!.messageId, keep.messageId);
        await last.messages[0]!.ack();
      } finally {
        await third.stop();
      }
      assert.equal(await pair.pending(), 0);
    } finally {
      await target.close?.();
      await pair.cleanup();
    }
  });

  test('prefetch bounds the delivered, unacknowledged messages', async () => {
    const pair = await fixture.pair(unique('prefetch'));
    const target = pair.target();
    try {
      await target.publish(relayed(Array.from({ length: 20 }, (_, i) => envelope(i))), context);
      const source = pair.source({ prefetch: 5 }) as RabbitMqSource;
      const { messages } = await collect(source);
      await eventually(() => messages.length === 5, 10_000, '5 deliveries');
      await sleep(300);
      assert.equal(messages.length, 5, 'no more than prefetch while none is acked');
      await messages[0]!.ack();
      await messages[1]!.ack();
      await eventually(() => messages.length === 7, 10_000, '2 more after 2 acks');
      await sleep(200);
      assert.equal(messages.length, 7);
      await source.stop();
      assert.equal(await pair.pending(), 18);
    } finally {
      await target.close?.();
      await pair.cleanup();
    }
  });

  test('declare makes the exchange, a durable queue of its type and its bindings; without declare a missing queue fails start', async () => {
    const exchange = unique('decl-x');
    const queue = unique('decl-q');
    made.exchanges.add(exchange);
    made.queues.add(queue);
    const source = rabbitmqSource({ url: url!, queue, declare: { exchange, bindingKeys: ['order.*'], type: 'classic' } });
    const { messages } = await collect(source);
    const target = rabbitmq({ url: url!, exchange });
    try {
      await target.publish(relayed([envelope(1), envelope(2, { type: 'invoice.sent', dataschema: 'urn:mailroom:invoice.sent:v1' })]), context);
      await eventually(() => messages.length === 1, 10_000, 'the bound event');
      await sleep(200);
      assert.equal(messages.length, 1, 'invoice.sent is not bound');
      assert.equal(target.unroutableCount, 1);
      await messages[0]!.ack();
    } finally {
      await source.stop();
      await target.close();
    }
    // classic, durable: a declare of a quorum queue of that name is refused
    await assert.rejects(admin((c) => c.assertQueue(queue, { durable: true, arguments: { 'x-queue-type': 'quorum' } })), /inequivalent arg 'x-queue-type'/);
    const wrongType = rabbitmqSource({ url: url!, queue, declare: { exchange } });
    await assert.rejects(wrongType.start(() => {}, sourceContext()), /exists with other settings than a durable quorum queue.*set declare.type/);
    const missing = rabbitmqSource({ url: url!, queue: unique('nope') });
    await assert.rejects(missing.start(() => {}, sourceContext()), /queue 't-\d+-\d+-nope' does not exist on amqp:\/\/guest:\*\*\*@.*declare: \{ exchange \}/);
  });

  test('sourceFrom(describe()) consumes the same queue', async () => {
    const pair = await fixture.pair(unique('describe'));
    const raw = await pair.raw();
    try {
      await raw.publish('{"not":"an event"}', { messageId: 'raw-1', headers: { traceparent: 'tp', 'X-Other': 'v' } });
      const description = JSON.parse(JSON.stringify(pair.describe())) as PairDescription;
      const source = fixture.sourceFrom(description, { prefetch: 1 });
      const { messages } = await collect(source as RabbitMqSource);
      await eventually(() => messages.length === 1, 10_000, 'the raw message');
      assert.equal(messages[0]!.messageId, 'raw-1');
      assert.deepEqual(messages[0]!.headers, { traceparent: 'tp', 'x-other': 'v' });
      assert.equal(String(Buffer.from(messages[0]!.body as Uint8Array)), '{"not":"an event"}');
      await messages[0]!.ack();
      await source.stop();
      assert.equal(await pair.pending(), 0);
    } finally {
      await raw.close();
      await pair.cleanup();
    }
  });
});

describe('rabbitmq source recovery without a restart', { skip }, () => {
  /** Closes, from the broker's side, the connections whose client name contains `name` (rabbitmqctl close_connection). */
  async function closeConnectionsNamed(name: string): Promise<number> {
    const { stdout } = await run('rabbitmqctl', ['list_connections', '--quiet', '--no-table-headers', 'pid', 'client_properties']);
    const pids = stdout
      .split('\n')
      .filter((line) => line.includes(name))
      .map((line) => line.split('\t')[0]!.trim());
    for (const pid of pids) await run('rabbitmqctl', ['close_connection', pid, 'test: dropped connection']);
    return pids.length;
  }

  test('a connection closed by the broker, and a deleted queue, are reported and the source goes on delivering', async () => {
    const pair = await fixture.pair(unique('drop'));
    const target = pair.target();
    const source = pair.source() as RabbitMqSource;
    try {
      const { messages, ctx } = await collect(source);
      await target.publish(relayed([envelope(1)]), context);
      await eventually(() => messages.length === 1, 10_000, 'a delivery');
      const queue = String(pair.describe().queue);
      assert.equal(await closeConnectionsNamed(`consumer source ${queue}`), 1);
      await eventually(() => ctx.reports.length >= 1, 10_000, 'the loss reported');
      assert.match(String(ctx.reports[0]), /lost the connection .*CONNECTION_FORCED - test: dropped connection.*reconnecting/);
      await messages[0]!.ack(); // on a dead connection: swallowed
      await eventually(() => messages.length === 2, 10_000, 'the unacked message redelivered on the new connection');
      assert.equal(messages[1]!.messageId, messages[0]!.messageId);
      await messages[1]!.ack();

      // The queue deleted under the consumer: RabbitMQ cancels it; the source re-declares and consumes again.
      await admin((c) => c.deleteQueue(queue));
      await eventually(() => ctx.reports.some((r) => /cancelled the consumer/.test(String(r))), 10_000, 'the cancel reported');
      // Declared, bound, then consumed: a consumer on the queue means the binding is back too (a
      // message published between the declare and the bind would be unroutable and dropped).
      await eventually(() => admin((c) => c.checkQueue(queue)).then((q) => q.consumerCount >= 1, () => false), 10_000, 'the queue declared, bound and consumed again');
      const after = envelope(2);
      await target.publish(relayed([after]), context);
      await eventually(() => messages.some((m) => m.messageId === after.id), 10_000, 'a delivery from the new queue');
    } finally {
      await source.stop();
      await target.close?.();
      await pair.cleanup();
    }
  });
});

describe('rabbitmq broker restart', { skip }, () => {
  test('the target rejects while RabbitMQ is down and succeeds after; the source reports, reconnects and goes on delivering', { timeout: 120_000 }, async (t) => {
    const pair = await rabbitPair(unique('restart'), { restartable: true });
    const node = pair.node!;
    const target = pair.target();
    const source = pair.source() as RabbitMqSource;
    try {
      const { messages, ctx } = await collect(source);
      await target.publish(relayed([envelope(1), envelope(2)]), context);
      await eventually(() => messages.length === 2, 10_000, '2 deliveries');
      await messages[0]!.ack(); // the second stays unacked through the restart

      const t0 = Date.now();
      await node.stopApp();
      const stopMs = Date.now() - t0;
      await assert.rejects(target.publish(relayed([envelope(3)]), context), /rabbitmq: (cannot connect to|the channel to)/);
      await eventually(() => ctx.reports.length >= 2, 10_000, 'the source to report the loss and a failed reconnect');
      assert.match(String(ctx.reports[0]), /lost the connection to amqp:\/\/guest:\*\*\*@.* consuming queue/);
      await messages[1]!.ack(); // its connection is gone: must not throw
      const t1 = Date.now();
      await node.startApp();
      const startMs = Date.now() - t1;
      t.diagnostic(`stop_app ${stopMs} ms, start_app until a connection succeeds ${startMs} ms`);

      const four = envelope(4);
      await target.publish(relayed([four]), context);
      await eventually(() => messages.some((m) => m.messageId === four.id), 30_000, 'delivery after the restart');
      const redelivered = messages.slice(2).filter((m) => m.messageId !== four.id);
      assert.equal(redelivered.length, 1, 'the message unacked at the restart comes again');
      assert.equal(redelivered[0]!.messageId, bodyId(messages[1]!));
      for (const m of messages.slice(2)) await m.ack();
    } finally {
      await source.stop();
      await target.close?.();
      await pair.cleanup();
    }
  });
});

describe('rabbitmq safety checks', { skip }, () => {
  const codes = (warnings: { code: string }[]) => warnings.map((w) => w.code);

  test("target: rabbitmq-exchange-missing only with declare: false and no such exchange", async () => {
    const missing = unique('gone-x');
    const present = unique('here-x');
    made.exchanges.add(present);
    await admin((c) => c.assertExchange(present, 'topic', { durable: true }));
    const warnings = await rabbitmq({ url: url!, exchange: missing, declare: false }).check({ republishHorizonMs: 30_000 });
    assert.deepEqual(codes(warnings), ['rabbitmq-exchange-missing']);
    assert.match(warnings[0]!.subject, new RegExp(`^rabbitmq amqp://guest:\\*\\*\\*@.* exchange ${missing}$`));
    assert.match(warnings[0]!.message, /does not exist .*\(declare: true\)/);
    assert.deepEqual(await rabbitmq({ url: url!, exchange: present, declare: false }).check({ republishHorizonMs: 30_000 }), []);
    assert.deepEqual(await rabbitmq({ url: url!, exchange: missing }).check({ republishHorizonMs: 30_000 }), [], 'declare: true makes it');
    await admin((c) => c.checkExchange(missing).then(() => assert.fail('check() must not create the exchange'), () => {}));
  });

  test('target: rabbitmq-no-delivery-limit for checkQueues without x-delivery-limit or a dead-letter exchange, rabbitmq-limit-drops for a limit without one (found through declare equivalence)', async () => {
    const { exchange } = await exchangeWithQueue('limits');
    const queues: Record<string, Record<string, unknown> | null> = {
      quorumPlain: { 'x-queue-type': 'quorum' },
      quorumLimit: { 'x-queue-type': 'quorum', 'x-delivery-limit': 5 },
      quorumLimitDlx: { 'x-queue-type': 'quorum', 'x-delivery-limit': 5, 'x-dead-letter-exchange': 'dlx' },
      quorumDlx: { 'x-queue-type': 'quorum', 'x-dead-letter-exchange': 'dlx' },
      // other arguments first: the probe adopts each one the server names until it learns the answer
      quorumOthersNoLimit: { 'x-queue-type': 'quorum', 'x-max-length': 100_000, 'x-single-active-consumer': true, 'x-overflow': 'reject-publish' },
      quorumOthersLimit: { 'x-queue-type': 'quorum', 'x-max-length': 100_000, 'x-message-ttl': 60_000, 'x-delivery-limit': 3 },
      classicPlain: null,
      classicDlx: { 'x-message-ttl': 1000, 'x-dead-letter-exchange': 'dlx' },
      stream: { 'x-queue-type': 'stream' }, // read by offset, never requeued: no warning
    };
    const names: Record<string, string> = {};
    await admin(async (c) => {
      for (const [what, args] of Object.entries(queues)) {
        names[what] = unique(what.toLowerCase());
        made.queues.add(names[what]!);
        await c.assertQueue(names[what]!, args === null ? { durable: true } : { durable: true, arguments: args });
      }
    });
    const nonDurable = unique('nondurable');
    made.queues.add(nonDurable);
    await admin((c) => c.assertQueue(nonDurable, { durable: false, autoDelete: true, arguments: { 'x-max-priority': 3 } }));
    const missing = unique('missing-q');
    const target = rabbitmq({ url: url!, exchange, checkQueues: [...Object.values(names), nonDurable, missing] });
    const warnings = await target.check({ republishHorizonMs: 30_000 });
    const bySubject = new Map(warnings.map((w) => [w.subject.split(' ').pop(), w.code]));
    assert.deepEqual(Object.fromEntries(Object.entries(names).map(([what, q]) => [what, bySubject.get(q) ?? null])), {
      quorumPlain: 'rabbitmq-no-delivery-limit',
      quorumLimit: 'rabbitmq-limit-drops',
      quorumLimitDlx: null,
      quorumDlx: null,
      quorumOthersNoLimit: 'rabbitmq-no-delivery-limit',
      quorumOthersLimit: 'rabbitmq-limit-drops',
      classicPlain: 'rabbitmq-no-delivery-limit',
      classicDlx: null,
      stream: null,
    });
    assert.equal(bySubject.get(nonDurable), 'rabbitmq-no-delivery-limit', 'non-durable, auto-delete queue with other arguments');
    assert.equal(bySubject.get(missing), 'rabbitmq-queue-missing');
    assert.equal(warnings.length, 7);
    assert.match(warnings.find((w) => w.code === 'rabbitmq-no-delivery-limit')!.message, /redelivered forever.*x-delivery-limit/);
    assert.match(warnings.find((w) => w.subject.endsWith(names.quorumLimit!))!.message, /has a delivery limit \(x-delivery-limit 5\) but no dead-letter exchange: a message its consumers fail that many times is dropped/);
    // the probe changed nothing: the queues keep their arguments, the missing one was not created
    await admin((c) => c.assertQueue(names.quorumOthersNoLimit!, { durable: true, arguments: queues.quorumOthersNoLimit }));
    await admin((c) => c.checkQueue(missing).then(() => assert.fail('check() must not create a queue'), () => {}));
  });

  test('target: rabbitmq-check-inconclusive when the probe cannot re-declare (a queue exclusive to another connection)', async () => {
    const exchange = unique('excl-x');
    const exclusive = unique('excl-q');
    const owner = await (await import('amqplib')).connect(url!);
    try {
      const ch = await owner.createChannel();
      await ch.assertQueue(exclusive, { exclusive: true });
      const warnings = await rabbitmq({ url: url!, exchange, checkQueues: [exclusive] }).check({ republishHorizonMs: 30_000 });
      assert.deepEqual(codes(warnings), ['rabbitmq-check-inconclusive']);
      assert.match(warnings[0]!.message, /exclusive to another connection/);
    } finally {
      await owner.close();
    }
    made.exchanges.add(exchange);
  });

  test('source: rabbitmq-queue-missing only without declare and with no such queue', async () => {
    const { queue } = await exchangeWithQueue('srccheck');
    const missing = unique('srcmissing');
    const warnings = await rabbitmqSource({ url: url!, queue: missing }).check();
    assert.deepEqual(codes(warnings), ['rabbitmq-queue-missing']);
    assert.match(warnings[0]!.message, /does not exist .*declare: \{ exchange \}/);
    assert.deepEqual(await rabbitmqSource({ url: url!, queue }).check(), []);
    assert.deepEqual(await rabbitmqSource({ url: url!, queue: missing, declare: { exchange: 'x' } }).check(), []);
  });
});

describe('rabbitmq acks of one channel', () => {
  /** A channel that records the frames it would send. */
  function recorder() {
    const frames: string[] = [];
    const channel = {
      ack: (m: ConsumeMessage, multiple = false) => void frames.push(`ack ${m.fields.deliveryTag}${multiple ? ' and before' : ''}`),
      nack: (m: ConsumeMessage) => void frames.push(`nack ${m.fields.deliveryTag}`),
    };
    return { frames, acks: new ChannelAcks(channel as unknown as Channel) };
  }
  const deliveries = (acks: ChannelAcks, n: number) =>
    Array.from({ length: n }, (_, i) => {
      const message = { fields: { deliveryTag: i + 1 } } as ConsumeMessage;
      acks.delivered(message);
      return message;
    });
  const tick = () => new Promise<void>((resolve) => queueMicrotask(resolve));

  test('a batch acked in one tick goes as one multiple-ack', async () => {
    const { frames, acks } = recorder();
    const m = deliveries(acks, 5);
    for (const message of m) acks.ack(message);
    assert.deepEqual(frames, [], 'sent after the tick, not per call');
    await tick();
    assert.deepEqual(frames, ['ack 5 and before']);
  });

  test('acks behind a delivery still held go one by one; the held one then takes the run after it', async () => {
    const { frames, acks } = recorder();
    const m = deliveries(acks, 6);
    acks.ack(m[1]!);
    acks.ack(m[2]!);
    await tick();
    assert.deepEqual(frames, ['ack 2', 'ack 3'], 'a multiple-ack of 3 would have acked 1 too');
    acks.ack(m[0]!);
    acks.ack(m[3]!);
    await tick();
    assert.deepEqual(frames.slice(2), ['ack 4 and before']);
    acks.ack(m[5]!);
    await tick();
    assert.deepEqual(frames.slice(3), ['ack 6'], '5 is still held');
  });

  test('a nack goes at once, after the acks given before it, and the acks after it pass over it', async () => {
    const { frames, acks } = recorder();
    const m = deliveries(acks, 4);
    acks.ack(m[0]!);
    acks.nack(m[1]!);
    assert.deepEqual(frames, ['ack 1 and before', 'nack 2']);
    acks.ack(m[2]!);
    acks.ack(m[3]!);
    await tick();
    assert.deepEqual(frames.slice(2), ['ack 4 and before']);
  });
});

describe('rabbitmq options', () => {
  const bad = (fn: () => unknown, option: string, message: RegExp) =>
    assert.throws(fn, (error: unknown) => {
      assert.ok(error instanceof ValidationError, `a ValidationError, got ${String(error)}`);
      assert.equal(error.issues[0]?.path, option);
      assert.match(error.message, message);
      return true;
    });
  const u = 'amqp://guest:guest@127.0.0.1:5672';

  test('target options: each bad one is a ValidationError naming it; defaults', () => {
    bad(() => rabbitmq({ url: u, exchange: '' }), 'exchange', /^rabbitmq: exchange must be a non-empty string$/);
    bad(() => rabbitmq({ url: u } as never), 'exchange', /exchange must be a non-empty string/);
    bad(() => rabbitmq({ url: u, exchange: 'x'.repeat(256) }), 'exchange', /at most 255 bytes/);
    bad(() => rabbitmq({ url: '', exchange: 'e' }), 'url', /url must be a non-empty string/);
    bad(() => rabbitmq({ url: 'http://h', exchange: 'e' }), 'url', /amqp:\/\/ or amqps:\/\//);
    bad(() => rabbitmq({ url: 'amqp://u:pw@', exchange: 'e' }), 'url', /is not a URL/);
    bad(() => rabbitmq({ url: u, exchange: 'e', name: 'has space' }), 'name', /name "has space" is not valid/);
    bad(() => rabbitmq({ url: u, exchange: 'e', declare: 'yes' as never }), 'declare', /declare must be true or false/);
    bad(() => rabbitmq({ url: u, exchange: 'e', routingKey: 'k' as never }), 'routingKey', /routingKey must be a function/);
    bad(() => rabbitmq({ url: u, exchange: 'e', confirmTimeout: 'soon' as never }), 'confirmTimeout', /confirmTimeout: "soon" is not a duration/);
    bad(() => rabbitmq({ url: u, exchange: 'e', confirmTimeout: 0 }), 'confirmTimeout', /at least 1 ms/);
    bad(() => rabbitmq({ url: u, exchange: 'e', unroutable: 'drop' as never }), 'unroutable', /unroutable must be 'warn' or 'fail'/);
    bad(() => rabbitmq({ url: u, exchange: 'e', checkQueues: 'q' as never }), 'checkQueues', /checkQueues must be an array/);
    bad(() => rabbitmq({ url: u, exchange: 'e', checkQueues: [''] }), 'checkQueues[0]', /checkQueues\[0\] must be a non-empty string/);
    bad(() => rabbitmq({ url: u, exchange: 'e', exchnage: 'typo' } as never), 'exchnage', /unknown option "exchnage"/);
    bad(() => rabbitmq(null as never), 'options', /options must be an object/);
    assert.equal(rabbitmq({ url: u, exchange: 'orders events/v1' }).name, 'rabbitmq:orders-events-v1');
    assert.equal(rabbitmq({ url: u, exchange: 'e'.repeat(200) }).name.length, 128);
    assert.equal(rabbitmq({ url: u, exchange: 'e', name: 'events-out' }).name, 'events-out');
  });

  test('source options: each bad one is a ValidationError naming it', () => {
    bad(() => rabbitmqSource({ url: u, queue: '' }), 'queue', /^rabbitmq: queue must be a non-empty string$/);
    bad(() => rabbitmqSource({ url: 'nats://x', queue: 'q' }), 'url', /amqp:\/\//);
    bad(() => rabbitmqSource({ url: u, queue: 'q', prefetch: 0 }), 'prefetch', /prefetch must be an integer from 1 to 65535, got 0/);
    bad(() => rabbitmqSource({ url: u, queue: 'q', prefetch: 1.5 }), 'prefetch', /prefetch must be an integer/);
    bad(() => rabbitmqSource({ url: u, queue: 'q', declare: true as never }), 'declare', /declare must be an object/);
    bad(() => rabbitmqSource({ url: u, queue: 'q', declare: {} as never }), 'declare.exchange', /declare.exchange must be a non-empty string/);
    bad(() => rabbitmqSource({ url: u, queue: 'q', declare: { exchange: 'e', bindingKeys: [] } }), 'declare.bindingKeys', /non-empty array/);
    bad(() => rabbitmqSource({ url: u, queue: 'q', declare: { exchange: 'e', bindingKeys: [1 as never] } }), 'declare.bindingKeys[0]', /must be a string/);
    bad(() => rabbitmqSource({ url: u, queue: 'q', declare: { exchange: 'e', type: 'stream' as never } }), 'declare.type', /'quorum' or 'classic'/);
    bad(() => rabbitmqSource({ url: u, queue: 'q', group: 'g' } as never), 'group', /unknown option "group"/);
    const source = rabbitmqSource({ url: u, queue: 'billing' });
    assert.equal(source.kind, 'rabbitmq');
    assert.equal(source.name, 'billing');
  });
});

describe('rabbitmq ceiling benchmark', { skip }, () => {
  test('publishes and confirms a tiny run, and removes its exchange and queue', async () => {
    const result = await ceiling({ url: url!, messages: 200, bodyBytes: 300 });
    assert.equal(result.messages, 200);
    assert.ok(result.seconds > 0 && result.perSecond > 0, JSON.stringify(result));
  });
});
