/**
 * The NATS JetStream adapter (src/brokers/nats) against a real nats-server:
 * NATS_URL for most tests, private servers (nats-server on a free port with
 * its own store) for restarts, outages and stalls.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { AckPolicy, DeliverPolicy, jetstream, StorageType, type JetStreamManager } from '@nats-io/jetstream';
import { connect, nanos, millis } from '@nats-io/transport-node';
import { ceiling } from '../bench/brokers/nats-ceiling.ts';
import { nats, natsSource } from '../src/brokers/nats/index.ts';
import type { SafetyWarning } from '../src/brokers/safety.ts';
import type { SourceContext, SourceMessage } from '../src/brokers/source.ts';
import { CLOUDEVENTS_CONTENT_TYPE, toWireMessage } from '../src/brokers/wire.ts';
import { ValidationError } from '../src/errors.ts';
import { RefusedEventError } from '../src/relay/refused.ts';
import { toEnvelope } from '../src/events/envelope.ts';
import { newId } from '../src/ids.ts';
import type { RelayContext, RelayedEvent } from '../src/relay/target.ts';
import { PubAckError, PubAckInbox } from '../src/brokers/nats/pub-acks.ts';
import { fixture, freePort, natsPair, PrivateNatsServer, withJsm } from './helpers/brokers/nats.ts';
import { testDatabases } from './helpers/databases.ts';
import { defineEvent } from '../src/index.ts';

const url = process.env.NATS_URL ?? null;
const skip = !url && 'set NATS_URL';
const NATS = url ?? 'nats://127.0.0.1:4222';

let counter = 0;
const unique = () => `t-${process.pid}-${++counter}`;
/** The relay's transaction: a broker target ignores it. */
const relayContext = { tx: {} } as unknown as RelayContext;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** A message's headers as wire text, none set. */
const NO_HEADERS = 'NATS/1.0\r\n\r\n';

function events(count: number, options: { type?: string; keyOf?: (i: number) => string; dataBytes?: (i: number) => number } = {}): RelayedEvent[] {
  return Array.from({ length: count }, (_, i) => {
    const id = newId();
    const envelope = toEnvelope({
      position: String(i + 1),
      xid: '1',
      id,
      type: options.type ?? 'order.created',
      version: 1,
      source: 'mailroom://test',
      subject: options.keyOf ? options.keyOf(i) : `order-${i % 3}`,
      time: new Date(),
      correlation_id: `corr-${i}`,
      causation_id: `cause-${i}`,
      traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
      headers: null,
      data: { i, pad: 'x'.repeat(options.dataBytes ? options.dataBytes(i) : 0) },
    });
    return { position: String(i + 1), xid: '1', envelope };
  });
}

interface Stored {
  seq: number;
  subject: string;
  headers: Record<string, string>;
  body: string;
}

async function readStream(server: string, stream: string): Promise<Stored[]> {
  return withJsm(server, async (jsm) => {
    const info = await jsm.streams.info(stream);
    const out: Stored[] = [];
    for (let seq = info.state.first_seq; seq <= info.state.last_seq && info.state.messages > 0; seq++) {
      const m = await jsm.streams.getMessage(stream, { seq });
      if (!m) continue;
      const headers: Record<string, string> = {};
      for (const [k, v] of m.header ?? []) headers[k] = v.join(',');
      out.push({ seq: m.seq, subject: m.subject, headers, body: new TextDecoder().decode(m.data) });
    }
    return out;
  });
}

async function createStream(server: string, stream: string, extra: { storage?: StorageType; duplicateWindowMs?: number; maxMsgSize?: number } = {}): Promise<void> {
  await withJsm(server, async (jsm) => {
    await jsm.streams.add({
      name: stream,
      subjects: [`${stream}.>`],
      storage: extra.storage ?? StorageType.File,
      duplicate_window: nanos(extra.duplicateWindowMs ?? 120_000),
      ...(extra.maxMsgSize ? { max_msg_size: extra.maxMsgSize } : {}),
    });
  });
}

const deleteStream = (server: string, stream: string) => withJsm(server, (jsm) => jsm.streams.delete(stream)).catch(() => undefined);

async function rawPublish(server: string, subject: string, body: string, msgID?: string): Promise<void> {
  await withJsm(server, async (_jsm, nc) => {
    await jetstream(nc).publish(subject, body, msgID ? { msgID } : {});
  });
}

interface Recorder extends SourceContext {
  readonly reports: unknown[];
  readonly warnings: SafetyWarning[];
  readonly messages: SourceMessage[];
  readonly deliver: (m: SourceMessage) => void;
  /** Resolves once `count` messages were delivered in all. */
  until(count: number, timeoutMs?: number): Promise<SourceMessage[]>;
}

function recorder(group: string, handlerTimeoutMs: number | null = null): Recorder {
  const reports: unknown[] = [];
  const warnings: SafetyWarning[] = [];
  const messages: SourceMessage[] = [];
  return {
    group,
    handlerTimeoutMs,
    reports,
    warnings,
    messages,
    report: (e) => reports.push(e),
    warn: (w) => warnings.push(w),
    deliver: (m) => messages.push(m),
    async until(count, timeoutMs = 10_000) {
      const deadline = Date.now() + timeoutMs;
      while (messages.length < count) {
        if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms with ${messages.length} of ${count} messages delivered`);
        await sleep(10);
      }
      return messages;
    },
  };
}

const eventId = (m: SourceMessage) => JSON.parse(typeof m.body === 'string' ? m.body : new TextDecoder().decode(m.body)).id as string;

/** Runs `fn`, then stops or closes `items` whatever happened. */
async function closing<T extends { close?(): Promise<void>; stop?(): Promise<void> }, R>(items: T[], fn: () => Promise<R>): Promise<R> {
  try {
    return await fn();
  } finally {
    for (const item of items) await (item.stop ?? item.close)?.call(item).catch(() => undefined);
  }
}

function isValidationErrorNaming(path: string) {
  return (error: unknown) => {
    assert.ok(error instanceof ValidationError, `expected a ValidationError, got ${String(error)}`);
    assert.equal(error.issues[0]?.path, path);
    assert.match(error.message, new RegExp(`^nats: ${path.replace(/[[\]]/g, '\\$&')} `));
    return true;
  };
}

describe('nats options', () => {
  test('bad target options throw a ValidationError naming the option', () => {
    const ok = { url: NATS, stream: 'orders' };
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ ...ok, url: '' }, 'url'],
      [{ ...ok, url: 42 }, 'url'],
      [{ ...ok, url: [] }, 'url'],
      [{ ...ok, url: [NATS, 'http://x:1'] }, 'url[1]'],
      [{ ...ok, stream: 'a.b' }, 'stream'],
      [{ ...ok, stream: '' }, 'stream'],
      [{ ...ok, subjectPrefix: 'a.*' }, 'subjectPrefix'],
      [{ ...ok, subjectPrefix: 'a..b' }, 'subjectPrefix'],
      [{ ...ok, name: 'has space' }, 'name'],
      [{ ...ok, name: 'x'.repeat(129) }, 'name'],
      [{ ...ok, declare: 'yes' }, 'declare'],
      [{ ...ok, ackTimeout: 'soon' }, 'ackTimeout'],
      [{ ...ok, ackTimeout: -5 }, 'ackTimeout'],
    ];
    for (const [options, path] of cases) {
      assert.throws(() => nats(options as never), isValidationErrorNaming(path), `${JSON.stringify(options)} should fail on ${path}`);
    }
    assert.throws(() => nats(null as never), isValidationErrorNaming('options'));
    assert.equal(nats(ok).name, 'nats:orders');
    assert.equal(nats({ ...ok, name: 'eu.orders:1' }).name, 'eu.orders:1');
    assert.equal(nats({ url: [NATS, '127.0.0.1:4223'], stream: 'orders', subjectPrefix: 'shop.orders', ackTimeout: '5s' }).name, 'nats:orders');
  });

  test('bad source options throw a ValidationError naming the option', () => {
    const ok = { url: NATS, stream: 'orders' };
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ ...ok, url: 'not a url' }, 'url'],
      [{ ...ok, stream: 'a>' }, 'stream'],
      [{ ...ok, durable: 'billing.v2' }, 'durable'],
      [{ ...ok, durable: '' }, 'durable'],
      [{ ...ok, filterSubject: 'orders.>.x' }, 'filterSubject'],
      [{ ...ok, ackWait: '10ms' }, 'ackWait'],
      [{ ...ok, prefetch: 0 }, 'prefetch'],
      [{ ...ok, prefetch: 1.5 }, 'prefetch'],
      [{ ...ok, from: 'latest' }, 'from'],
    ];
    for (const [options, path] of cases) {
      assert.throws(() => natsSource(options as never), isValidationErrorNaming(path), `${JSON.stringify(options)} should fail on ${path}`);
    }
    const s = natsSource({ ...ok, filterSubject: 'orders.order.*', ackWait: '45s', prefetch: 10, from: 'earliest' });
    assert.equal(s.kind, 'nats');
    assert.equal(s.name, 'orders');
  });

  test('a group name that is no valid durable name fails start with a ValidationError naming durable', async () => {
    const source = natsSource({ url: NATS, stream: 'orders' });
    await assert.rejects(source.start(() => {}, recorder('billing.v2')), (e: unknown) => {
      assert.ok(e instanceof ValidationError);
      assert.equal(e.issues[0]?.path, 'durable');
      assert.match(e.message, /consumer group's name/);
      return true;
    });
  });
});

describe('nats PubAck inbox', { skip }, () => {
  test('an answer is a stored message only with a sequence and no error: an error is refused with its code, and anything else fails', async () => {
    const nc = await connect({ servers: NATS });
    try {
      // A plain subscriber answers in place of a stream, with whatever each test message asks for.
      const subject = `pubacks.${unique()}`;
      const answers: Record<string, string> = {
        stored: '{"stream":"S","seq":7}',
        duplicate: '{"stream":"S","seq":7,"duplicate":true}',
        refused: '{"error":{"code":400,"err_code":10070,"description":"wrong last msg ID"},"stream":"S","seq":0}',
        noSeq: '{"stream":"S"}',
        notJson: 'seq": nothing',
        lookalike: 'a "seq": 1, but no PubAck',
        empty: '',
      };
      nc.subscribe(`${subject}.*`, {
        callback: (_, msg) => {
          msg.respond(answers[msg.subject.slice(subject.length + 1)]!);
        },
      });
      await nc.flush();
      const acks = new PubAckInbox(nc);
      const outcomes = await acks.publishAll(Object.keys(answers).map((name) => ({ subject: `${subject}.${name}`, body: new Uint8Array([1]), headers: NO_HEADERS }))).outcomes;
      const byName = Object.fromEntries(Object.keys(answers).map((name, i) => [name, outcomes[i]!]));
      assert.deepEqual(byName.stored, { ok: true });
      assert.deepEqual(byName.duplicate, { ok: true }, 'a duplicate is stored already');
      const refused = byName.refused!;
      assert.ok(!refused.ok && refused.error instanceof PubAckError && refused.error.errCode === 10070 && /wrong last msg ID/.test(refused.error.message));
      for (const name of ['noSeq', 'notJson', 'lookalike', 'empty']) {
        const outcome = byName[name]!;
        assert.ok(!outcome.ok, `${name}: not a stored message`);
      }
      const noSeq = byName.noSeq!;
      assert.ok(!noSeq.ok && /no PubAck/.test(noSeq.error.message), `an answer without a sequence names what it is: ${noSeq.ok ? '' : noSeq.error.message}`);
    } finally {
      await nc.close();
    }
  });
  test('a batch goes out as frames written by the inbox: UTF-8 bodies and headers arrive byte for byte, a message over max_payload alone fails, a closed connection fails each', async () => {
    const nc = await connect({ servers: NATS });
    try {
      const subject = `frames.${unique()}`;
      const received: { subject: string; body: string; note: string; id: string }[] = [];
      nc.subscribe(`${subject}.*`, {
        callback: (_, msg) => {
          received.push({ subject: msg.subject, body: msg.string(), note: msg.headers?.get('Note') ?? '(none)', id: msg.headers?.get('Nats-Msg-Id') ?? '(none)' });
          msg.respond('{"stream":"S","seq":1}');
        },
      });
      await nc.flush();
      const acks = new PubAckInbox(nc);
      // The client this package pins has the protocol layer the inbox writes through: not the slower fallback.
      assert.equal(acks.writesFrames, true);
      const maxPayload = nc.info!.max_payload;
      const bodies = ['{"name":"Zoë","price":"12 €","mood":"😀"}', 'plain', 'x'.repeat(maxPayload), '{"last":"ü"}'];
      const sent = acks.publishAll([
        ...bodies.map((body, i) => ({ subject: `${subject}.s${i}`, body, headers: `NATS/1.0\r\nNats-Msg-Id: m${i}\r\nNote: café ${i}\r\n\r\n` })),
        { subject: `${subject}.bytes`, body: new Uint8Array([0xe2, 0x82, 0xac]), headers: NO_HEADERS },
      ]);
      const outcomes = await sent.outcomes;
      assert.deepEqual(outcomes.map((o) => (o.ok ? 'ok' : o.error.name)), ['ok', 'ok', 'InvalidArgumentError', 'ok', 'ok']);
      assert.match((outcomes[2] as { error: Error }).error.message, /max_payload/, 'named as the client names it, so the target refuses the event for good');
      assert.deepEqual(received, [
        { subject: `${subject}.s0`, body: bodies[0], note: 'café 0', id: 'm0' },
        { subject: `${subject}.s1`, body: 'plain', note: 'café 1', id: 'm1' },
        { subject: `${subject}.s3`, body: bodies[3], note: 'café 3', id: 'm3' },
        { subject: `${subject}.bytes`, body: '€', note: '', id: '' },
      ]);
      await nc.close();
      const late = await acks.publishAll([{ subject: `${subject}.s9`, body: 'late', headers: NO_HEADERS }]).outcomes;
      assert.equal(late.length, 1);
      assert.equal(late[0]!.ok, false, 'a closed connection fails the message instead of holding it');
    } finally {
      await nc.close();
    }
  });
  test('a batch published while the connection drains is failed when the drain closes it, not left waiting for answers', async () => {
    const nc = await connect({ servers: NATS });
    try {
      const subject = `draining.${unique()}`;
      const responder = await connect({ servers: NATS });
      try {
        responder.subscribe(`${subject}.*`, { callback: (_, msg) => void msg.respond('{"stream":"S","seq":1}') });
        await responder.flush();
        const acks = new PubAckInbox(nc);
        const ok = await acks.publishAll([{ subject: `${subject}.before`, body: 'before', headers: NO_HEADERS }]).outcomes;
        assert.equal(ok[0]!.ok, true, 'answered while the connection is open');
        const drained = nc.drain();
        assert.equal(nc.isDraining(), true);
        // The client still sends while it drains; the inbox's subscription is drained first, so no answer can come back.
        const late = acks.publishAll([0, 1, 2].map((i) => ({ subject: `${subject}.late${i}`, body: `late ${i}`, headers: NO_HEADERS }))).outcomes;
        const outcomes = await Promise.race([late, sleep(5_000).then(() => null)]);
        assert.ok(outcomes !== null, 'the batch is settled once the drain ends, not left to its deadline');
        assert.deepEqual(outcomes.map((o) => (o.ok ? 'ok' : o.error.message)), ['the connection closed', 'the connection closed', 'the connection closed']);
        await drained;
      } finally {
        await responder.close();
      }
    } finally {
      if (!nc.isClosed()) await nc.close();
    }
  });
});

describe('nats PubAck inbox deadlines', { skip }, () => {
  test('expire fails only the messages of a batch still waiting; the batch resolves with the answers it had, in order', async () => {
    const nc = await connect({ servers: NATS });
    try {
      // Answers the messages whose subject ends in .answered; the .silent ones are taken (so the server
      // sends no "no responders") and never answered.
      const subject = `deadline.${unique()}`;
      nc.subscribe(`${subject}.answered`, {
        callback: (_, msg) => {
          msg.respond('{"stream":"S","seq":1}');
        },
      });
      nc.subscribe(`${subject}.silent`, { callback: () => {} });
      await nc.flush();
      const acks = new PubAckInbox(nc);
      const names = ['answered', 'silent', 'answered', 'silent'];
      const sent = acks.publishAll(names.map((name) => ({ subject: `${subject}.${name}`, body: new Uint8Array([1]), headers: NO_HEADERS })));
      assert.equal(sent.to - sent.from, 3);
      let settled = false;
      void sent.outcomes.then(() => (settled = true));
      await nc.flush();
      await sleep(100);
      assert.equal(settled, false, 'two still wait');
      acks.expire(sent.from, sent.to, 250);
      const outcomes = await sent.outcomes;
      assert.deepEqual(
        outcomes.map((o) => (o.ok ? 'ok' : o.error.name)),
        ['ok', 'TimeoutError', 'ok', 'TimeoutError'],
      );
      const next = acks.publishAll([{ subject: `${subject}.answered`, body: new Uint8Array([2]), headers: NO_HEADERS }]);
      assert.equal(next.from, sent.to + 1, 'numbers go on after the batch');
      assert.deepEqual(await next.outcomes, [{ ok: true }]);
      assert.deepEqual(await acks.publishAll([]).outcomes, [], 'an empty batch resolves at once');
    } finally {
      await nc.close();
    }
  });
});

describe('nats target', { skip }, () => {
  test('publishes a batch in order and resolves after the PubAcks, with id, content type and headers on the wire', async () => {
    const stream = `mr-${unique()}`;
    const target = nats({ url: NATS, stream });
    await closing([target], async () => {
      const batch = events(250, { type: 'order.created' });
      await target.publish(batch, relayContext);
      // Resolved: the stream already holds every event (read on another connection).
      const stored = await readStream(NATS, stream);
      assert.equal(stored.length, 250);
      for (const [i, m] of stored.entries()) {
        const wire = toWireMessage(batch[i]!.envelope);
        assert.equal(m.subject, `${stream}.order.created`);
        assert.equal(m.headers['Nats-Msg-Id'], wire.id);
        assert.equal(m.headers['content-type'], CLOUDEVENTS_CONTENT_TYPE);
        assert.equal(m.headers['traceparent'], wire.headers.traceparent);
        assert.equal(m.headers['correlationid'], `corr-${i}`);
        assert.equal(m.headers['causationid'], `cause-${i}`);
        assert.equal(m.headers['partitionkey'], `order-${i % 3}`);
        assert.equal(m.body, wire.body.toString('utf8'));
      }
    }).finally(() => deleteStream(NATS, stream));
  });

  test("an event over the server's max_payload is refused for good (RefusedEventError naming it); the events before it are stored", async () => {
    const stream = `mr-${unique()}`;
    const target = nats({ url: NATS, stream });
    await closing([target], async () => {
      // Over max_payload (1 MB by default): the client refuses to send it.
      const batch = events(3, { dataBytes: (i) => (i === 1 ? 1_100_000 : 0) });
      await assert.rejects(target.publish(batch, relayContext), (error: unknown) => {
        assert.ok(error instanceof RefusedEventError, `refused for good, got ${String(error)}`);
        assert.equal(error.eventId, batch[1]!.envelope.id);
        assert.match(error.reason, /^nats: the message is larger than the server's max_payload .*raise max_payload or lower mailroom's maxPayloadBytes; stream mr-/);
        return true;
      });
      const ids = (await readStream(NATS, stream)).map((m) => m.headers['Nats-Msg-Id']);
      assert.deepEqual(ids, [batch[0]!.envelope.id]);
    }).finally(() => deleteStream(NATS, stream));
  });

  test('declares a missing stream: subjects <prefix>.>, file storage, a duplicate window covering the republish horizon', async () => {
    const stream = `mr-${unique()}`;
    const target = nats({ url: NATS, stream, subjectPrefix: `shop.${stream}` });
    await closing([target], async () => {
      assert.deepEqual(await target.check({ republishHorizonMs: 300_000 }), [], 'a stream the target will declare gets no warning');
      await target.publish(events(1, { type: 'order.paid' }), relayContext);
      const info = await withJsm(NATS, (jsm) => jsm.streams.info(stream));
      assert.deepEqual(info.config.subjects, [`shop.${stream}.>`]);
      assert.equal(info.config.storage, StorageType.File);
      assert.equal(millis(info.config.duplicate_window), 300_000);
      assert.equal((await readStream(NATS, stream))[0]?.subject, `shop.${stream}.order.paid`);

      const other = `mr-${unique()}`;
      const plain = nats({ url: NATS, stream: other });
      await plain.publish(events(1), relayContext);
      await plain.close();
      assert.equal(millis((await withJsm(NATS, (jsm) => jsm.streams.info(other))).config.duplicate_window), 120_000, 'at least 2 minutes');
      await deleteStream(NATS, other);
    }).finally(() => deleteStream(NATS, stream));
  });

  test('relay.start() declares the stream before it resolves: a natsSource started next finds it and gets the events published after', async () => {
    const stream = `mr-${unique()}`;
    const { mailroom } = await testDatabases()[0]!.open();
    const relay = mailroom.relay({ to: [nats({ url: NATS, stream })], internal: false, pollInterval: 20, lease: '3m' });
    const reports: unknown[] = [];
    relay.on('error', (e) => reports.push(e));
    const source = natsSource({ url: NATS, stream, durable: 'billing' });
    const ctx = recorder('billing');
    await closing([relay, source], async () => {
      await relay.start();
      const info = await withJsm(NATS, (jsm) => jsm.streams.info(stream));
      assert.equal(millis(info.config.duplicate_window), 185_000, "the window covers the relay's republish horizon (lease 3 min + 5 s)");
      await source.start(ctx.deliver, ctx);
      const startedAt = defineEvent<{ n: number }>(`started.${stream}`, { version: 1 });
      await mailroom.publish(startedAt, { n: 1 });
      const [m] = await ctx.until(1);
      assert.equal(JSON.parse(new TextDecoder().decode(m!.body as Uint8Array)).data.n, 1);
      assert.deepEqual(reports, []);
    }).finally(() => deleteStream(NATS, stream));
  });

  test('relay.start() with a nats target that cannot connect still starts and reports the error naming the server (its publishes try again)', async () => {
    const { mailroom } = await testDatabases()[0]!.open();
    const down = `nats://127.0.0.1:${await freePort()}`;
    const relay = mailroom.relay({ to: [nats({ url: down, stream: `mr-${unique()}` })], internal: false, pollInterval: 20 });
    const reports: unknown[] = [];
    relay.on('error', (e) => reports.push(e));
    await closing([relay], async () => {
      await relay.start();
      assert.ok(reports.some((e) => e instanceof Error && e.message.includes(`nats: cannot connect to ${down}`)), `reported: ${reports.map(String).join('; ')}`);
    });
  });

  test('the stream deduplicates a republished event id, and a republished batch keeps its order', async () => {
    const stream = `mr-${unique()}`;
    const target = nats({ url: NATS, stream });
    await closing([target], async () => {
      const batch = events(10);
      await target.publish(batch.slice(0, 6), relayContext);
      // The relay crashed after the PubAcks, before its cursor moved: it publishes the whole batch again.
      await target.publish(batch, relayContext);
      await target.publish(batch, relayContext);
      const stored = await readStream(NATS, stream);
      assert.deepEqual(
        stored.map((m) => m.headers['Nats-Msg-Id']),
        batch.map((e) => e.envelope.id),
      );
    }).finally(() => deleteStream(NATS, stream));
  });

  test('a message from another publisher between two attempts of a batch: the rest goes one by one, in order', async () => {
    const stream = `mr-${unique()}`;
    const target = nats({ url: NATS, stream });
    await closing([target], async () => {
      const batch = events(5);
      await target.publish(batch.slice(0, 2), relayContext);
      await rawPublish(NATS, `${stream}.foreign`, 'not mailroom', 'foreign-1');
      await target.publish(batch, relayContext);
      const ids = (await readStream(NATS, stream)).map((m) => m.headers['Nats-Msg-Id']);
      const e = batch.map((x) => x.envelope.id);
      assert.deepEqual(ids, [e[0], e[1], 'foreign-1', e[2], e[3], e[4]]);
    }).finally(() => deleteStream(NATS, stream));
  });

  test('a batch sent after an event (context.after, as a pipelined relay sends it) is refused whole unless that event is the stream\'s last, and then goes in behind it', async () => {
    const stream = `mr-${unique()}`;
    const target = nats({ url: NATS, stream });
    await closing([target], async () => {
      const [first, second, third] = [events(4), events(3), events(2)];
      await target.publish(events(1), relayContext); // declares the stream
      await assert.rejects(target.publish(second, { ...relayContext, after: first.at(-1)! }), /nats: publishing event 1 of 3 .* failed/);
      await target.publish(first, relayContext);
      await target.publish(second, { ...relayContext, after: first.at(-1)! });
      await rawPublish(NATS, `${stream}.foreign`, 'not mailroom', 'foreign-1');
      await assert.rejects(target.publish(third, { ...relayContext, after: second.at(-1)! }), /failed/, 'another publisher came in between');
      const ids = (await readStream(NATS, stream)).map((m) => m.headers['Nats-Msg-Id']).slice(1);
      assert.deepEqual(ids, [...first, ...second].map((x) => x.envelope.id).concat('foreign-1'));
    }).finally(() => deleteStream(NATS, stream));
  });

  test('a key or correlation id with a line break: the event goes out without that header (the body keeps it), and the batch is not stuck', async () => {
    const stream = `mr-${unique()}`;
    const target = nats({ url: NATS, stream });
    await closing([target], async () => {
      const batch = events(3);
      const odd = { ...batch[1]!, envelope: { ...batch[1]!.envelope, subject: 'order\r\n7', partitionkey: 'order\r\n7', correlationid: 'req\n7' } };
      await target.publish([batch[0]!, odd, batch[2]!], relayContext);
      const stored = await readStream(NATS, stream);
      assert.deepEqual(stored.map((m) => m.headers['Nats-Msg-Id']), batch.map((e) => e.envelope.id));
      assert.equal(stored[1]!.headers['partitionkey'], undefined);
      assert.equal(stored[1]!.headers['correlationid'], undefined);
      assert.equal(stored[1]!.headers['causationid'], 'cause-1', 'the other headers still travel');
      const body = JSON.parse(stored[1]!.body) as { subject: string; correlationid: string };
      assert.deepEqual([body.subject, body.correlationid], ['order\r\n7', 'req\n7']);
    }).finally(() => deleteStream(NATS, stream));
  });

  test('header values beyond ASCII travel intact; an id with a line break is refused for good, naming it, and nothing is stored', async () => {
    const stream = `mr-${unique()}`;
    const target = nats({ url: NATS, stream });
    await closing([target], async () => {
      const [plain, other] = events(2);
      const accented = { ...plain!, envelope: { ...plain!.envelope, correlationid: 'bestellung-ü-注文', partitionkey: 'kunde-ø' } };
      await target.publish([accented], relayContext);
      const [stored] = await readStream(NATS, stream);
      assert.equal(stored!.headers['correlationid'], 'bestellung-ü-注文');
      assert.equal(stored!.headers['partitionkey'], 'kunde-ø');
      assert.equal(stored!.headers['Nats-Msg-Id'], plain!.envelope.id);
      const injected = { ...other!, envelope: { ...other!.envelope, id: 'evt-1\r\nNats-Expected-Stream: elsewhere' } };
      await assert.rejects(target.publish([injected], relayContext), (error: unknown) => {
        assert.ok(error instanceof RefusedEventError, `refused for good, got ${String(error)}`);
        assert.equal(error.eventId, injected.envelope.id);
        assert.match(error.reason, /nats: its id .* holds a line break/);
        return true;
      });
      assert.equal((await readStream(NATS, stream)).length, 1, 'nothing more stored');
    }).finally(() => deleteStream(NATS, stream));
  });

  test("an event over the stream's max_msg_size is refused for good (RefusedEventError naming it), and no later event of the batch is stored ahead of it", async () => {
    const stream = `mr-${unique()}`;
    await createStream(NATS, stream, { maxMsgSize: 2_000 });
    const target = nats({ url: NATS, stream, declare: false });
    await closing([target], async () => {
      // Event 3 (index 2) is too big for the stream; the later, small ones must not overtake it.
      const batch = events(6, { dataBytes: (i) => (i === 2 ? 5_000 : 10) });
      await assert.rejects(target.publish(batch, relayContext), (error: unknown) => {
        assert.ok(error instanceof RefusedEventError, `refused for good, got ${String(error)}`);
        assert.equal(error.eventId, batch[2]!.envelope.id);
        assert.match(error.reason, new RegExp(`^nats: the stream refuses the message as larger than its max_msg_size \\(message size exceeds maximum allowed\\); stream ${stream}, subject ${stream}\\.order\\.created$`));
        return true;
      });
      const ids = (await readStream(NATS, stream)).map((m) => m.headers['Nats-Msg-Id']);
      assert.deepEqual(ids, batch.slice(0, 2).map((x) => x.envelope.id));
    }).finally(() => deleteStream(NATS, stream));
  });

  test('a stream deleted under a connected target: the publish fails at once saying no stream captures the subject, and nothing is stored', async () => {
    const stream = `mr-${unique()}`;
    await createStream(NATS, stream);
    const target = nats({ url: NATS, stream, declare: false, ackTimeout: '20s' });
    await closing([target], async () => {
      await target.publish(events(1), relayContext); // connected
      await deleteStream(NATS, stream);
      const started = Date.now();
      await assert.rejects(target.publish(events(3), relayContext), /nats: no stream captures event 1 of 3 .*check that the stream exists/);
      assert.ok(Date.now() - started < 5_000, 'answered by the server (no responders), not by the ackTimeout');
      await createStream(NATS, stream);
      const batch = events(2);
      await target.publish(batch, relayContext);
      assert.deepEqual((await readStream(NATS, stream)).map((m) => m.headers['Nats-Msg-Id']), batch.map((x) => x.envelope.id));
    }).finally(() => deleteStream(NATS, stream));
  });

  test('rejects while the server is down, names it, and publishes again once it is back', async () => {
    const server = await PrivateNatsServer.create();
    const stream = `mr-${unique()}`;
    const target = nats({ url: server.url, stream, ackTimeout: '3s' });
    await closing([target], async () => {
      await target.publish(events(2), relayContext);
      await server.stop();
      const down = events(3);
      await assert.rejects(target.publish(down, relayContext), (e: Error) => {
        assert.match(e.message, new RegExp(`nats: (cannot connect to ${server.url}|publishing event 1 of 3 .* on ${server.url})`));
        return true;
      });
      await server.start();
      await target.publish(down, relayContext);
      assert.equal((await readStream(server.url, stream)).length, 5);
    }).finally(() => server.destroy());
  });

  test('a stalled server: the publish rejects after ackTimeout instead of hanging, and a later publish succeeds', async () => {
    const server = await PrivateNatsServer.create();
    const stream = `mr-${unique()}`;
    const target = nats({ url: server.url, stream, ackTimeout: 700 });
    await closing([target], async () => {
      await target.publish(events(1), relayContext);
      server.signal('SIGSTOP');
      const started = Date.now();
      try {
        await assert.rejects(target.publish(events(3), relayContext), /no PubAck for event 1 of 3 .* within the ackTimeout of 700 ms/);
        assert.ok(Date.now() - started < 3_000, `rejected after ${Date.now() - started} ms`);
      } finally {
        server.signal('SIGCONT');
      }
      await target.publish(events(2), relayContext);
      // The first batch and the last one; the stalled one may or may not have landed (the relay would republish it).
      assert.ok((await readStream(server.url, stream)).length >= 3);
    }).finally(() => server.destroy());
  });

  test('a refused connection names the URL', async () => {
    const port = await freePort();
    const target = nats({ url: `nats://127.0.0.1:${port}`, stream: 'orders' });
    await assert.rejects(target.publish(events(1), relayContext), new RegExp(`nats: cannot connect to nats://127.0.0.1:${port}: .*refused`));
    await target.close();
  });

  test('declare: false and no stream: publish rejects saying how to create it', async () => {
    const stream = `mr-${unique()}`;
    const target = nats({ url: NATS, stream, declare: false });
    await assert.rejects(target.publish(events(1), relayContext), new RegExp(`stream ${stream} does not exist .* declare: false; create it \\(nats stream add ${stream}`));
    await target.close();
  });

  test('check(): nats-stream-missing, nats-duplicate-window and nats-memory-storage fire exactly when their condition holds', async () => {
    const missing = `mr-${unique()}`;
    const short = `mr-${unique()}`;
    const memory = `mr-${unique()}`;
    const good = `mr-${unique()}`;
    await createStream(NATS, short, { duplicateWindowMs: 10_000 });
    await createStream(NATS, memory, { storage: StorageType.Memory, duplicateWindowMs: 300_000 });
    await createStream(NATS, good, { duplicateWindowMs: 300_000 });
    const codes = async (stream: string, declare: boolean, republishHorizonMs: number) => {
      const target = nats({ url: NATS, stream, declare });
      try {
        const warnings = await target.check({ republishHorizonMs });
        for (const w of warnings) {
          assert.equal(w.subject, `nats ${NATS} stream ${stream}`);
          assert.match(w.message, new RegExp(stream));
        }
        return warnings.map((w) => w.code).sort();
      } finally {
        await target.close();
      }
    };
    try {
      assert.deepEqual(await codes(missing, false, 60_000), ['nats-stream-missing']);
      assert.deepEqual(await codes(missing, true, 60_000), []);
      assert.deepEqual(await codes(short, true, 60_000), ['nats-duplicate-window']);
      assert.deepEqual(await codes(short, false, 10_000), []);
      assert.deepEqual(await codes(memory, true, 60_000), ['nats-memory-storage']);
      assert.deepEqual(await codes(memory, true, 400_000), ['nats-duplicate-window', 'nats-memory-storage']);
      assert.deepEqual(await codes(good, false, 300_000), []);
    } finally {
      for (const s of [short, memory, good]) await deleteStream(NATS, s);
    }
  });

  test('check(): nats-max-payload fires when the largest event publish accepts, with its envelope, exceeds the stream\'s max_msg_size or the server\'s max_payload', async () => {
    const small = `mr-${unique()}`;
    await createStream(NATS, small, { duplicateWindowMs: 300_000, maxMsgSize: 100_000 });
    const sizeWarnings = async (stream: string, maxPayloadBytes: number | undefined) => {
      const target = nats({ url: NATS, stream, declare: false });
      try {
        return (await target.check({ republishHorizonMs: 60_000, ...(maxPayloadBytes === undefined ? {} : { maxPayloadBytes }) })).filter((w) => w.code === 'nats-max-payload');
      } finally {
        await target.close();
      }
    };
    try {
      assert.deepEqual(await sizeWarnings(small, undefined), [], 'not checked without the mailroom\'s limit');
      assert.deepEqual(await sizeWarnings(small, 50_000), [], '50,000 bytes and the envelope fit 100,000');
      const [stream] = await sizeWarnings(small, 200_000);
      assert.match(stream!.message, new RegExp(`does not fit stream ${small}'s max_msg_size \\(100000 bytes\\).*Lower maxPayloadBytes to 95904 or less.*nats stream edit ${small} --max-msg-size 204096`));
      // Without max_msg_size the server's max_payload (1 MB by default) is the limit.
      await withJsm(NATS, (jsm) => jsm.streams.update(small, { subjects: [`${small}.>`], max_msg_size: -1 }));
      assert.deepEqual(await sizeWarnings(small, 200_000), []);
      const [serverLimit] = await sizeWarnings(small, 64 * 1024 * 1024);
      assert.match(serverLimit!.message, /does not fit the server's max_payload \(\d+ bytes\).*max_payload: 67112960 in the server's configuration/);
    } finally {
      await deleteStream(NATS, small);
    }
  });
});

describe('nats source', { skip }, () => {
  test('delivers body, message id, lower-case headers and origin; an acked message is not redelivered, an unacked one is given back on stop', async () => {
    const pair = await natsPair(unique());
    try {
      const target = pair.target();
      const batch = events(4);
      await target.publish(batch, relayContext);
      const first = pair.source();
      const ctx = recorder('ignored');
      await first.start(ctx.deliver, ctx);
      const got = await ctx.until(4);
      assert.deepEqual(got.map(eventId), batch.map((e) => e.envelope.id));
      const m = got[0]!;
      const wire = toWireMessage(batch[0]!.envelope);
      assert.equal(m.messageId, wire.id);
      assert.equal(new TextDecoder().decode(m.body as Uint8Array), wire.body.toString('utf8'));
      assert.equal(m.headers?.['content-type'], CLOUDEVENTS_CONTENT_TYPE);
      assert.equal(m.headers?.['traceparent'], wire.headers.traceparent);
      assert.equal(m.headers?.['correlationid'], 'corr-0');
      assert.equal(m.headers?.['partitionkey'], 'order-0');
      assert.equal(m.headers?.['nats-msg-id'], wire.id);
      for (const name of Object.keys(m.headers ?? {})) assert.equal(name, name.toLowerCase());
      assert.match(m.origin, /^nats stream mr-t-\d+-\d+, consumer g-t-\d+-\d+, sequence 1, delivery 1$/);
      await got[0]!.ack();
      await got[1]!.ack();
      await first.stop();
      assert.equal(await pair.pending(), 2, 'two unacked');

      const second = fixture.sourceFrom(pair.describe());
      const ctx2 = recorder('ignored');
      await second.start(ctx2.deliver, ctx2);
      const again = await ctx2.until(2, 3_000); // given back by stop(): well before AckWait (5 s)
      assert.deepEqual(again.map(eventId).sort(), [batch[2]!.envelope.id, batch[3]!.envelope.id].sort());
      assert.match(again[0]!.origin, /delivery 2$/);
      for (const x of again) await x.ack();
      await sleep(300);
      assert.equal(ctx2.messages.length, 2, 'acked messages are not redelivered');
      await second.stop();
      assert.equal(await pair.pending(), 0);
    } finally {
      await pair.cleanup();
    }
  });

  test('raw messages (no mailroom) come through with their id and headers', async () => {
    const pair = await natsPair(unique());
    try {
      const raw = await pair.raw();
      await raw.publish('{"not":"a cloudevent"}', { messageId: 'raw-1', headers: { 'ce-id': 'x1', 'Content-Type': 'application/json' } });
      await raw.publish(Buffer.from('no id'));
      assert.equal(await pair.pending(), 2);
      const source = pair.source();
      const ctx = recorder('g');
      await source.start(ctx.deliver, ctx);
      const [a, b] = await ctx.until(2);
      assert.equal(a!.messageId, 'raw-1');
      assert.equal(a!.headers?.['ce-id'], 'x1');
      assert.equal(a!.headers?.['content-type'], 'application/json');
      assert.equal(b!.messageId, null);
      a!.ack();
      b!.ack();
      await source.stop();
      assert.equal(await pair.pending(), 0);
    } finally {
      await pair.cleanup();
    }
  });

  test('an unacked message is redelivered after AckWait while the source runs', async () => {
    const stream = `mr-${unique()}`;
    await createStream(NATS, stream);
    const source = natsSource({ url: NATS, stream, durable: 'late', ackWait: 1_000, from: 'earliest' });
    const ctx = recorder('late');
    await closing([source], async () => {
      await rawPublish(NATS, `${stream}.x`, 'hello', 'only-1');
      await source.start(ctx.deliver, ctx);
      const [first, second] = await ctx.until(2, 5_000);
      assert.equal(first!.messageId, 'only-1');
      assert.equal(second!.messageId, 'only-1');
      assert.match(second!.origin, /delivery 2$/);
      second!.ack();
      first!.ack(); // a second ack of the same message: harmless
    }).finally(() => deleteStream(NATS, stream));
  });

  test('prefetch bounds the delivered, unacknowledged messages', async () => {
    const pair = await natsPair(unique());
    try {
      await pair.target().publish(events(20), relayContext);
      const source = pair.source({ prefetch: 5 });
      const ctx = recorder('g');
      await source.start(ctx.deliver, ctx);
      await ctx.until(5);
      await sleep(500);
      assert.equal(ctx.messages.length, 5);
      const info = await withJsm(NATS, (jsm: JetStreamManager) => jsm.consumers.info(String(pair.describe().stream), String(pair.describe().durable)));
      assert.equal(info.num_ack_pending, 5);
      ctx.messages[0]!.ack();
      ctx.messages[1]!.nack();
      await ctx.until(7);
      await sleep(300);
      assert.equal(ctx.messages.length, 7, 'one ack and one nack make room for two more');
      // Ack whatever arrives: all 20 come through, plus the nacked one again.
      const deadline = Date.now() + 10_000;
      while (ctx.messages.length < 21 && Date.now() < deadline) {
        for (const m of ctx.messages) m.ack();
        await sleep(10);
      }
      for (const m of ctx.messages) m.ack();
      assert.equal(ctx.messages.length, 21);
      assert.equal(new Set(ctx.messages.map(eventId)).size, 20);
      await source.stop();
      assert.equal(await pair.pending(), 0);
    } finally {
      await pair.cleanup();
    }
  });

  test('reconnects after a server restart, reports it, and goes on delivering; ack and nack of a dead connection do not throw', async () => {
    const pair = await natsPair(unique(), { restartable: true });
    try {
      const target = pair.target();
      await target.publish(events(3), relayContext);
      const source = pair.source();
      const ctx = recorder('g');
      await source.start(ctx.deliver, ctx);
      const before = await ctx.until(3);
      before[0]!.ack();
      await sleep(100);
      await pair.restart();
      before[1]!.ack(); // its connection is gone: swallowed, redelivered later, deduplicated by mailroom
      before[2]!.nack();
      await target.publish(events(2), relayContext); // the target reconnects too
      await ctx.until(5 + 2, 15_000); // 2 new + the 2 unacked ones again after AckWait
      await sleep(300);
      const after = ctx.messages;
      assert.ok(ctx.reports.length >= 1, 'the lost connection was reported');
      assert.match(String(ctx.reports[0]), new RegExp(`nats: consumer ${pair.durable} on stream ${pair.stream} \\(${pair.url}\\): .*; reconnecting in 100 ms`));
      for (const m of after) m.ack();
      await source.stop();
      assert.equal(await pair.pending(), 0);
    } finally {
      await pair.cleanup();
    }
  });

  test('keeps retrying while the server is down and resumes when it is back', async () => {
    const pair = await natsPair(unique(), { restartable: true });
    try {
      const source = pair.source();
      const ctx = recorder('g');
      await source.start(ctx.deliver, ctx);
      const raw = await pair.raw();
      await raw.publish('one', { messageId: 'one' });
      await raw.close();
      await ctx.until(1);
      await ctx.messages[0]!.ack();
      // The server applies an ack asynchronously: stopped before that, it would deliver 'one' again (at least once).
      for (const deadline = Date.now() + 5_000; (await pair.pending()) !== 0 && Date.now() < deadline; ) await sleep(50);
      assert.equal(await pair.pending(), 0, "'one' is acked before the server stops");
      // Down for a while: several failed reconnects, each reported, with growing delays.
      await pair.server!.stop();
      // The first three come after about 0.7 s of delays (100, 200, 400 ms); a loaded machine takes longer.
      for (const deadline = Date.now() + 10_000; ctx.reports.length < 3 && Date.now() < deadline; ) await sleep(50);
      assert.ok(ctx.reports.length >= 3, `reports: ${ctx.reports.length}`);
      assert.match(String(ctx.reports.at(-1)), new RegExp(`cannot connect to ${pair.url}: .*; reconnecting in (400|800|1600) ms`));
      await pair.server!.start();
      const raw2 = await pair.raw();
      await raw2.publish('two', { messageId: 'two' });
      await raw2.close();
      await ctx.until(2, 10_000);
      assert.equal(ctx.messages[1]!.messageId, 'two');
      ctx.messages[1]!.ack();
      await source.stop();
    } finally {
      await pair.cleanup();
    }
  });

  test('a stalled server (SIGSTOP): the source notices the missing heartbeats, reconnects once it resumes, and stops promptly', async () => {
    const pair = await natsPair(unique(), { restartable: true });
    try {
      const source = pair.source();
      const ctx = recorder('g');
      await source.start((m) => { ctx.deliver(m); m.ack(); }, ctx);
      const raw = await pair.raw();
      await raw.publish('a', { messageId: 'a' });
      await ctx.until(1);
      // The ack is fire-and-forget: wait until the server has it, or a stop that catches it in flight
      // makes the server deliver 'a' again after the stall (at-least-once, but not what this test is about).
      const acked = Date.now() + 5_000;
      while ((await pair.pending()) !== 0 && Date.now() < acked) await sleep(50);
      assert.equal(await pair.pending(), 0, "the server has the ack of 'a' before it is stopped");
      pair.server!.signal('SIGSTOP');
      try {
        const deadline = Date.now() + 15_000;
        while (ctx.reports.length === 0 && Date.now() < deadline) await sleep(50);
        assert.match(String(ctx.reports[0]), /heartbeats missed; reconnecting in 100 ms/);
      } finally {
        pair.server!.signal('SIGCONT');
      }
      await raw.publish('b', { messageId: 'b' });
      await ctx.until(2, 10_000);
      assert.equal(ctx.messages[1]!.messageId, 'b');
      const stopping = Date.now();
      await source.stop();
      assert.ok(Date.now() - stopping < 2_000);
    } finally {
      await pair.cleanup();
    }
  });

  test('creates its durable from the group, with explicit acks, unlimited deliveries, AckWait max(30 s, handler timeout), from now or earliest', async () => {
    const stream = `mr-${unique()}`;
    await createStream(NATS, stream);
    try {
      await rawPublish(NATS, `${stream}.a`, 'before');
      const now = natsSource({ url: NATS, stream });
      const ctxNow = recorder('billing', 45_000);
      const earliest = natsSource({ url: NATS, stream, durable: 'audit', from: 'earliest', filterSubject: `${stream}.a` });
      const ctxEarliest = recorder('ignored', null);
      await closing([now, earliest], async () => {
        await now.start(ctxNow.deliver, ctxNow);
        await earliest.start(ctxEarliest.deliver, ctxEarliest);
        assert.equal(now.name, `${stream}/billing`);
        assert.equal(earliest.name, `${stream}/audit`);
        await rawPublish(NATS, `${stream}.a`, 'after');
        await ctxEarliest.until(2);
        await ctxNow.until(1);
        await sleep(200);
        assert.deepEqual(ctxNow.messages.map((m) => new TextDecoder().decode(m.body as Uint8Array)), ['after']);
        assert.deepEqual(ctxEarliest.messages.map((m) => new TextDecoder().decode(m.body as Uint8Array)), ['before', 'after']);
        for (const m of [...ctxNow.messages, ...ctxEarliest.messages]) m.ack();
        const [billing, audit] = await withJsm(NATS, async (jsm) => [await jsm.consumers.info(stream, 'billing'), await jsm.consumers.info(stream, 'audit')]);
        assert.equal(billing!.config.ack_policy, AckPolicy.Explicit);
        assert.equal(billing!.config.max_deliver, -1);
        assert.equal(billing!.config.deliver_policy, DeliverPolicy.New);
        assert.equal(millis(billing!.config.ack_wait!), 45_000);
        assert.equal(audit!.config.deliver_policy, DeliverPolicy.All);
        assert.equal(audit!.config.filter_subject, `${stream}.a`);
        assert.equal(millis(audit!.config.ack_wait!), 30_000);
        assert.deepEqual(ctxNow.warnings, []);
        assert.deepEqual(ctxEarliest.warnings, []);
      });
    } finally {
      await deleteStream(NATS, stream);
    }
  });

  test('a missing stream, a push consumer or one with cumulative acks fails start with a clear error', async () => {
    const stream = `mr-${unique()}`;
    await assert.rejects(natsSource({ url: NATS, stream, durable: 'x' }).start(() => {}, recorder('x')), new RegExp(`nats: stream ${stream} does not exist on ${NATS}`));
    await createStream(NATS, stream);
    try {
      await withJsm(NATS, (jsm) => jsm.consumers.add(stream, { durable_name: 'pushy', ack_policy: AckPolicy.Explicit, deliver_subject: `deliver.${stream}` }));
      await assert.rejects(natsSource({ url: NATS, stream, durable: 'pushy' }).start(() => {}, recorder('x')), /consumer pushy on stream .* is a push consumer/);
      // ack_policy all: one process's ack would cover messages another process of the group holds (docs/brokers/nats.md).
      await withJsm(NATS, (jsm) => jsm.consumers.add(stream, { durable_name: 'cumulative', ack_policy: AckPolicy.All }));
      const cumulative = natsSource({ url: NATS, stream, durable: 'cumulative' });
      try {
        await assert.rejects(cumulative.start(() => {}, recorder('x')), /consumer cumulative on stream .* has ack_policy all; .*needs ack_policy explicit/);
      } finally {
        await cumulative.stop(); // nothing to stop unless it wrongly started
      }
      const kept = await withJsm(NATS, (jsm) => jsm.consumers.info(stream, 'cumulative'));
      assert.equal(kept.config.ack_policy, AckPolicy.All, 'the refused consumer is left as it was');
    } finally {
      await deleteStream(NATS, stream);
    }
  });

  test('check(): nats-ack-wait and nats-max-deliver fire exactly when their condition holds', async () => {
    const stream = `mr-${unique()}`;
    await createStream(NATS, stream);
    const addConsumer = (durable: string, ackWaitMs: number, maxDeliver: number) =>
      withJsm(NATS, (jsm) => jsm.consumers.add(stream, { durable_name: durable, ack_policy: AckPolicy.Explicit, ack_wait: nanos(ackWaitMs), max_deliver: maxDeliver }));
    const run = async (durable: string, handlerTimeoutMs: number | null) => {
      const source = natsSource({ url: NATS, stream, durable });
      const ctx = recorder('g', handlerTimeoutMs);
      try {
        const before = (await source.check()).map((w) => w.code);
        assert.ok(!before.includes('nats-ack-wait'), 'before start there is no handler timeout to compare with');
        await source.start(ctx.deliver, ctx);
        assert.deepEqual(ctx.warnings, [], 'start leaves the warnings to check(), which mailroom runs after it');
        const checked = await source.check();
        for (const w of checked) assert.equal(w.subject, `nats ${NATS} stream ${stream} consumer ${durable}`);
        return checked.map((w) => w.code).sort();
      } finally {
        await source.stop();
      }
    };
    try {
      await addConsumer('short', 5_000, -1);
      await addConsumer('long', 60_000, -1);
      await addConsumer('limited', 60_000, 3);
      assert.deepEqual(await run('short', 10_000), ['nats-ack-wait']);
      assert.deepEqual(await run('short', 5_000), []);
      assert.deepEqual(await run('short', null), []);
      assert.deepEqual(await run('long', 10_000), []);
      assert.deepEqual(await run('limited', 10_000), ['nats-max-deliver']);
      assert.deepEqual(await run('limited', 120_000), ['nats-ack-wait', 'nats-max-deliver']);
    } finally {
      await deleteStream(NATS, stream);
    }
  });

  test('check(context) before start: the group names the durable, its handler timeout judges AckWait (what mailroom doctor runs)', async () => {
    const stream = `mr-${unique()}`;
    await createStream(NATS, stream);
    try {
      await withJsm(NATS, (jsm) => jsm.consumers.add(stream, { durable_name: 'billing', ack_policy: AckPolicy.Explicit, ack_wait: nanos(5_000), max_deliver: 3 }));
      const source = natsSource({ url: NATS, stream });
      assert.deepEqual(await source.check(), [], 'neither a durable option nor a group: nothing to look at');
      const found = await source.check({ group: 'billing', handlerTimeoutMs: 10_000 });
      assert.deepEqual(found.map((w) => w.code).sort(), ['nats-ack-wait', 'nats-max-deliver']);
      assert.equal(found[0]!.subject, `nats ${NATS} stream ${stream} consumer billing`);
      assert.deepEqual((await source.check({ group: 'billing', handlerTimeoutMs: null })).map((w) => w.code), ['nats-max-deliver']);
      await source.stop();
      // Consumers that start would refuse: doctor says so (alone: recreating the consumer settles the rest), naming the fix.
      await withJsm(NATS, async (jsm) => {
        await jsm.consumers.add(stream, { durable_name: 'cumulative', ack_policy: AckPolicy.All, ack_wait: nanos(5_000), max_deliver: 3 });
        await jsm.consumers.add(stream, { durable_name: 'pushed', ack_policy: AckPolicy.Explicit, deliver_subject: `deliver.${stream}` });
      });
      const cumulative = await source.check({ group: 'cumulative', handlerTimeoutMs: 10_000 });
      assert.deepEqual(cumulative.map((w) => w.code), ['nats-consumer-refused']);
      assert.match(cumulative[0]!.message, new RegExp(`^consumer cumulative on stream ${stream} has ack_policy all; .*nats consumer rm ${stream} cumulative.*\\. The source refuses to start on it\\.$`));
      const pushed = await source.check({ group: 'pushed', handlerTimeoutMs: null });
      assert.deepEqual(pushed.map((w) => w.code), ['nats-consumer-refused']);
      assert.match(pushed[0]!.message, /is a push consumer \(deliver_subject deliver\./);
    } finally {
      await deleteStream(NATS, stream);
    }
  });

  test('several sources of one durable share its messages', async () => {
    const pair = await natsPair(unique());
    try {
      const a = pair.source({ prefetch: 3 });
      const b = fixture.sourceFrom(pair.describe(), { prefetch: 3 });
      const ctxA = recorder('g');
      const ctxB = recorder('g');
      await a.start((m) => { ctxA.deliver(m); m.ack(); }, ctxA);
      await b.start((m) => { ctxB.deliver(m); m.ack(); }, ctxB);
      const batch = events(40);
      await pair.target().publish(batch, relayContext);
      const deadline = Date.now() + 10_000;
      while (ctxA.messages.length + ctxB.messages.length < 40 && Date.now() < deadline) await sleep(10);
      const ids = [...ctxA.messages, ...ctxB.messages].map(eventId).sort();
      assert.deepEqual(ids, batch.map((e) => e.envelope.id).sort());
      await a.stop();
      await b.stop();
      assert.equal(await pair.pending(), 0);
    } finally {
      await pair.cleanup();
    }
  });
});

describe('nats ceiling', { skip }, () => {
  test('publishes with PubAcks in batches of 100 and reports a rate', async () => {
    const result = await ceiling({ url: NATS, messages: 200 });
    assert.equal(result.messages, 200);
    assert.ok(result.perSecond > 0 && result.seconds > 0);
  });
});
