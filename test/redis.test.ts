/**
 * The Redis Streams adapter against a real server: REDIS_URL (the shared
 * server, no persistence) and private redis-servers with AOF for the tests
 * that stop, freeze or restart the broker.
 */
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { Redis } from 'ioredis';
import { ceiling } from '../bench/brokers/redis-ceiling.ts';
import { ADD_SCRIPT, dedupKey, eventArguments } from '../src/brokers/redis/add-script.ts';
import { guardKeys, markOf, MARK_SCRIPT } from '../src/brokers/redis/mark-script.ts';
import { respOf } from '../src/brokers/redis/encoded-command.ts';
import { wireTextOf } from '../src/brokers/wire.ts';
import { redisSource, redisStreams } from '../src/brokers/redis/index.ts';
import type { SafetyWarning } from '../src/brokers/safety.ts';
import type { SourceContext, SourceMessage } from '../src/brokers/source.ts';
import { CLOUDEVENTS_CONTENT_TYPE } from '../src/brokers/wire.ts';
import { ValidationError } from '../src/errors.ts';
import type { CloudEventEnvelope } from '../src/events/envelope.ts';
import { newId } from '../src/ids.ts';
import type { RelayContext, RelayedEvent } from '../src/relay/target.ts';
import type { Queryable } from '../src/storage/driver.ts';
import { fixture, type RedisPair } from './helpers/brokers/redis.ts';
import { databaseUrl, testDatabases } from './helpers/databases.ts';
import { createMailroom, defineEvent } from '../src/index.ts';
import pg from 'pg';
import { createDatabase, dropDatabase, withDatabase } from '../bench/db.ts';
import { eventually } from './helpers/events.ts';

const url = process.env.REDIS_URL;
const skip = !url && 'set REDIS_URL';

let serial = 0;
const unique = () => `t-${process.pid}-${++serial}`;
const TRACEPARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
const relayContext: RelayContext = { tx: null as unknown as Queryable };

function events(count: number, key: string | null = 'order-1'): RelayedEvent[] {
  return Array.from({ length: count }, (_, i) => {
    const envelope: CloudEventEnvelope = {
      specversion: '1.0',
      id: newId(),
      source: 'mailroom://test',
      type: 'order.created',
      time: new Date().toISOString(),
      datacontenttype: 'application/json',
      dataschema: 'urn:mailroom:order.created:v1',
      ...(key === null ? {} : { subject: key, partitionkey: key }),
      correlationid: 'corr-1',
      causationid: 'cause-1',
      traceparent: TRACEPARENT,
      data: { n: i },
    };
    return { position: String(++serial), xid: '1', envelope };
  });
}

function recorder(group = 'mailroom-group'): {
  messages: SourceMessage[];
  reports: unknown[];
  warnings: SafetyWarning[];
  deliver: (m: SourceMessage) => void;
  context: SourceContext;
} {
  const messages: SourceMessage[] = [];
  const reports: unknown[] = [];
  const warnings: SafetyWarning[] = [];
  return {
    messages,
    reports,
    warnings,
    deliver: (m) => messages.push(m),
    context: { group, handlerTimeoutMs: null, report: (e) => reports.push(e), warn: (w) => warnings.push(w) },
  };
}

function fieldsOf(flat: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (let i = 0; i + 1 < flat.length; i += 2) out[flat[i]!] = flat[i + 1]!;
  return out;
}

const idsOf = (list: RelayedEvent[]) => list.map((e) => e.envelope.id);

/** Events at the given (xid, position) points, as the relay reads them; a batch is sent sorted by position. */
function at(points: [xid: number, position: number][]): RelayedEvent[] {
  const made = events(points.length);
  return points.map(([xid, position], i) => ({ ...made[i]!, xid: String(xid), position: String(position) }));
}
const byPosition = (list: RelayedEvent[]) => [...list].sort((a, b) => Number(a.position) - Number(b.position));
/** A batch as the relay makes one: the first `count` events in read order (a range of marks), sent by position. */
const relayBatch = (list: RelayedEvent[], count: number) => byPosition([...list].sort((a, b) => (markOf(a) < markOf(b) ? -1 : 1)).slice(0, count));
/** A made-up origin (the relay reads its database's), one per test. */
const originOf = () => `test:${process.pid}:${++serial}`;

/** Runs the mark script by hand for `list` as one call of `attempt` (for states a publish reaches only through a failure). */
async function markCall(p: RedisPair, origin: string, attempt: string, list: RelayedEvent[], opts: { batchEnd?: string; before?: string; maxLen?: string } = {}): Promise<unknown> {
  const args: (string | number)[] = [attempt, opts.batchEnd ?? '', opts.before ?? '', opts.maxLen ?? '', CLOUDEVENTS_CONTENT_TYPE];
  for (const e of list) {
    args.push(markOf(e));
    eventArguments(args, wireTextOf(e));
  }
  return p.admin.eval(MARK_SCRIPT, 3, p.stream, ...guardKeys(p.stream, origin), ...args);
}
async function streamIds(p: RedisPair): Promise<string[]> {
  return (await p.admin.xrange(p.stream, '-', '+')).map(([, f]) => fieldsOf(f).id!);
}
const messageIds = (messages: SourceMessage[]) => messages.map((m) => m.messageId);
const settle = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const pairs: RedisPair[] = [];
async function pair(restartable = false): Promise<RedisPair> {
  const p = await fixture.pair(unique(), { restartable });
  pairs.push(p);
  return p;
}
after(async () => {
  await Promise.all(pairs.map((p) => p.cleanup()));
});

describe('redis target', { skip }, () => {
  test('publishes a batch: resolves with every entry in Redis, with id, content type, headers and body as specified', async () => {
    const p = await pair();
    const target = p.target();
    const batch = events(3);
    await target.publish(batch, relayContext);
    const entries = await p.admin.xrange(p.stream, '-', '+');
    assert.equal(entries.length, 3);
    const fields = fieldsOf(entries[0]![1]);
    const envelope = batch[0]!.envelope;
    assert.deepEqual(Object.keys(fields), ['id', 'type', 'key', 'content-type', 'traceparent', 'correlationid', 'causationid', 'partitionkey', 'body']);
    assert.equal(fields.id, envelope.id);
    assert.equal(fields.type, 'order.created');
    assert.equal(fields.key, 'order-1');
    assert.equal(fields['content-type'], CLOUDEVENTS_CONTENT_TYPE);
    assert.equal(fields.traceparent, TRACEPARENT);
    assert.equal(fields.correlationid, 'corr-1');
    assert.equal(fields.causationid, 'cause-1');
    assert.equal(fields.partitionkey, 'order-1');
    assert.deepEqual(JSON.parse(fields.body!), envelope);
    // An event without a key has no `key` field.
    await target.publish(events(1, null), relayContext);
    const [last] = await p.admin.xrevrange(p.stream, '+', '-', 'COUNT', 1);
    assert.equal(fieldsOf(last![1]).key, undefined);
    assert.equal(target.name, `redis:${p.stream}`);
  });

  test('each event carries exactly the headers it has, in order, whichever of them are missing', async () => {
    const p = await pair();
    const target = p.target();
    const [base] = events(1);
    const { correlationid: _c, causationid: _k, traceparent: _t, ...bare } = base!.envelope;
    const variants: CloudEventEnvelope[] = [
      { ...bare, id: newId() }, // key, partitionkey only
      { ...bare, id: newId(), subject: undefined, partitionkey: undefined, causationid: 'cause-2' },
      { ...bare, id: newId(), traceparent: TRACEPARENT, correlationid: 'corr-3' },
      { ...bare, id: newId(), subject: 'order-4', partitionkey: 'shard-9' }, // a partition key apart from the subject
    ];
    const batch = variants.map((envelope) => ({ position: String(++serial), xid: '1', envelope: JSON.parse(JSON.stringify(envelope)) as CloudEventEnvelope }));
    await target.publish(batch, relayContext);
    const entries = (await p.admin.xrange(p.stream, '-', '+')).map(([, f]) => fieldsOf(f));
    assert.deepEqual(
      entries.map((f) => Object.keys(f)),
      [
        ['id', 'type', 'key', 'content-type', 'partitionkey', 'body'],
        ['id', 'type', 'content-type', 'causationid', 'body'],
        ['id', 'type', 'key', 'content-type', 'traceparent', 'correlationid', 'partitionkey', 'body'],
        ['id', 'type', 'key', 'content-type', 'partitionkey', 'body'],
      ],
    );
    assert.deepEqual(
      entries.map((f) => [f.id, f.key, f.causationid, f.traceparent, f.correlationid, f.partitionkey]),
      [
        [batch[0]!.envelope.id, 'order-1', undefined, undefined, undefined, 'order-1'],
        [batch[1]!.envelope.id, undefined, 'cause-2', undefined, undefined, undefined],
        [batch[2]!.envelope.id, 'order-1', undefined, TRACEPARENT, 'corr-3', 'order-1'],
        [batch[3]!.envelope.id, 'order-4', undefined, undefined, undefined, 'shard-9'],
      ],
    );
    assert.deepEqual(entries.map((f) => JSON.parse(f.body!)), batch.map((e) => e.envelope));
  });

  test('text beyond ASCII (keys, headers, short and long bodies) arrives byte for byte, guarded by id and by mark', async () => {
    const p = await pair();
    const target = p.target();
    const texts = ['é', 'ключ-☃', '🚚'.repeat(40), 'x'.repeat(63) + 'ü', 'ß'.repeat(200)];
    const batch = texts.map((text, i) => {
      const [made] = events(1, `order-${text}`);
      const envelope = { ...made!.envelope, correlationid: `corr-${text}`, data: { text } };
      return { position: String(100 + i), xid: '7', envelope };
    });
    await target.publish(batch.slice(0, 2), relayContext);
    await target.publish(batch.slice(2), { ...relayContext, origin: originOf() });
    const entries = (await p.admin.xrange(p.stream, '-', '+')).map(([, f]) => fieldsOf(f));
    assert.deepEqual(
      entries.map((f) => [f.key, f.partitionkey, f.correlationid]),
      texts.map((text) => [`order-${text}`, `order-${text}`, `corr-${text}`]),
    );
    assert.deepEqual(entries.map((f) => JSON.parse(f.body!)), batch.map((e) => e.envelope));
  });

  test('keeps outbox order within a batch, across the script calls of a large batch; a republished large batch adds nothing', async () => {
    const p = await pair();
    const batch = events(250); // three script calls: 100, 100, 50
    const target = p.target();
    await target.publish(batch, relayContext);
    const entries = await p.admin.xrange(p.stream, '-', '+');
    assert.deepEqual(entries.map(([, f]) => fieldsOf(f).id), idsOf(batch));
    await target.publish(batch, relayContext);
    assert.equal(await p.admin.xlen(p.stream), 250);
  });

  test('a batch sent after an event (context.after, as a pipelined relay sends it) adds nothing until that event was added, then goes in behind it', async () => {
    const p = await pair();
    const target = p.target();
    const [first, second] = [events(4), events(3)];
    await assert.rejects(target.publish(second, { ...relayContext, after: first.at(-1)! }), /MAILROOM_ORDER/);
    assert.equal(await p.admin.xlen(p.stream), 0, 'nothing added');
    for (const e of second) assert.equal(await p.admin.exists(dedupKey(p.stream, e.envelope.id)), 0);
    await target.publish(first, relayContext);
    await target.publish(second, { ...relayContext, after: first.at(-1)! });
    const entries = await p.admin.xrange(p.stream, '-', '+');
    assert.deepEqual(entries.map(([, f]) => fieldsOf(f).id), [...idsOf(first), ...idsOf(second)]);
  });

  test("the target's guard refuses a republished event id within the dedup window", async () => {
    const p = await pair();
    const target = p.target();
    const [a, b, c] = events(3);
    await target.publish([a!, b!], relayContext);
    await target.publish([a!, b!, c!], relayContext); // the relay crashed after the replies: the batch comes again, plus one
    await target.publish([b!], relayContext);
    const entries = await p.admin.xrange(p.stream, '-', '+');
    assert.deepEqual(entries.map(([, f]) => fieldsOf(f).id), idsOf([a!, b!, c!]));
    const ttl = await p.admin.pttl(dedupKey(p.stream, a!.envelope.id));
    assert.ok(ttl > 23 * 3_600_000 && ttl <= 24 * 3_600_000, `dedup key ttl ${ttl}`);
  });

  test('a dedup window that passed lets the event in again; maxLen trims about to the limit', async () => {
    const p = await pair();
    const target = redisStreams({ url: p.url, stream: p.stream, dedupWindow: '1s', maxLen: 10, name: 'short-window' });
    try {
      const [a] = events(1);
      await target.publish([a!], relayContext);
      await p.admin.pexpire(dedupKey(p.stream, a!.envelope.id), 1); // the window is over
      await settle(5);
      await target.publish([a!], relayContext);
      assert.equal(await p.admin.xlen(p.stream), 2);
      for (let i = 0; i < 5; i++) await target.publish(events(100), relayContext);
      const length = await p.admin.xlen(p.stream);
      assert.ok(length < 502 && length >= 10, `approximate trimming left ${length} entries`);
    } finally {
      await target.close?.();
    }
  });

  test('an XADD that fails undoes its dedup key (the retry adds the event); an event whose predecessor was not added is refused', async () => {
    const p = await pair();
    const target = p.target();
    await p.admin.del(p.stream);
    await p.admin.set(p.stream, 'not a stream');
    const batch = events(3);
    await assert.rejects(target.publish(batch, relayContext), (err: Error) => {
      assert.match(err.message, /WRONGTYPE/);
      assert.match(err.message, new RegExp(`stream ${p.stream} on redis://`));
      assert.match(err.message, /retries the batch/);
      return true;
    });
    for (const e of batch) assert.equal(await p.admin.exists(dedupKey(p.stream, e.envelope.id)), 0);
    await p.admin.del(p.stream);
    await target.publish(batch, relayContext);
    const entries = await p.admin.xrange(p.stream, '-', '+');
    assert.deepEqual(entries.map(([, f]) => fieldsOf(f).id), idsOf(batch));

    // The order guard on its own: KEYS[2] (the previous run's last dedup key) is missing.
    const [next] = events(1);
    const keys = [p.stream, dedupKey(p.stream, 'never-added'), dedupKey(p.stream, next!.envelope.id)];
    await assert.rejects(p.admin.eval(ADD_SCRIPT, 3, ...keys, '1', 60_000, '', 4, 'id', next!.envelope.id, 'body', '{}'), /MAILROOM_ORDER/);
    assert.equal(await p.admin.xlen(p.stream), 3);
    assert.equal(await p.admin.exists(keys[2]!), 0);
    // A run stops at its first failed XADD: the events after it in the run are not added either.
    const more = events(3);
    await p.admin.del(p.stream);
    await p.admin.set(p.stream, 'not a stream');
    await assert.rejects(target.publish(more, relayContext), /WRONGTYPE/);
    for (const e of more) assert.equal(await p.admin.exists(dedupKey(p.stream, e.envelope.id)), 0);
    await p.admin.del(p.stream);
  });

  test("the relay's batches (an origin given) are recognised by their place in the outbox: again, read further, or in another order, each event is added once; no key per event is kept", async () => {
    const p = await pair();
    const target = p.target();
    const origin = originOf();
    const context = { ...relayContext, origin };
    // Read order is (xid, position); a batch goes out by position: marks 10:1, 10:2, 12:3, 11:4.
    const first = at([[10, 1], [10, 2], [12, 3], [11, 4]]);
    await target.publish(byPosition(first), context);
    await target.publish(byPosition(first), context); // the replies were lost: the same batch again
    const further = [...first, ...at([[12, 5], [13, 6]])]; // the relay crashed before its cursor moved, and read on
    await target.publish(byPosition(further), context);
    // A later batch with a lower position than one already added (a higher xid): not a duplicate.
    const later = at([[14, 9], [15, 7]]);
    await target.publish(byPosition(later), context);
    assert.deepEqual(await streamIds(p), idsOf([...further, ...byPosition(later)]));
    const [state, marks] = guardKeys(p.stream, origin);
    assert.equal(await p.admin.hget(state, 'done'), markOf({ xid: '15', position: '7' }));
    assert.equal(await p.admin.exists(marks), 0, 'no marks kept past whole batches');
    for (const e of [...further, ...later]) assert.equal(await p.admin.exists(dedupKey(p.stream, e.envelope.id)), 0, 'no key per event');
    // Without the origin (a republished parked event), the dedup key per event id guards instead.
    const [parked] = events(1);
    await target.publish([parked!], relayContext);
    await target.publish([parked!], relayContext);
    assert.equal(await p.admin.exists(dedupKey(p.stream, parked!.envelope.id)), 1);
    assert.equal(await p.admin.xlen(p.stream), 9);
  });

  test('a batch that failed part-way, retried in another composition and split, adds each event once; so do two attempts interleaved; a failed XADD adds nothing after it', async () => {
    const p = await pair();
    const target = p.target();
    const origin = originOf();
    const context = { ...relayContext, origin };
    const outbox = at(Array.from({ length: 250 }, (_, i): [number, number] => [100 + (i % 7), i + 1]));
    const sent = relayBatch(outbox, 200);
    // The first call of a batch went in; the rest failed (or its replies were lost before the cursor moved).
    assert.equal(await markCall(p, origin, 'attempt-1', sent.slice(0, 100)), 100);
    // Retried as 250 events in three calls (100, 100, 50), sorted by position anew: only the 150 not yet added go in.
    const retry = relayBatch(outbox, 250);
    await target.publish(retry, context);
    const firstIds = idsOf(sent.slice(0, 100));
    const expected = [...firstIds, ...idsOf(retry).filter((id) => !firstIds.includes(id))];
    assert.deepEqual(await streamIds(p), expected);
    assert.equal(new Set(expected).size, 250);
    assert.equal(await p.admin.exists(guardKeys(p.stream, origin)[1]), 0);

    // Two attempts interleaved (a relay that lost its lease still sending): A's first call, all of B (a shorter
    // batch from the same cursor), then A's second call.
    const later = at(Array.from({ length: 200 }, (_, i): [number, number] => [200 + (i % 5), 300 + i]));
    const a = relayBatch(later, 200);
    const b = relayBatch(later, 150);
    const highest = a.map(markOf).sort().at(-1)!;
    assert.equal(await markCall(p, origin, 'A', a.slice(0, 100)), 100);
    await target.publish(b, context);
    const byB = b.filter((e) => !a.slice(0, 100).includes(e)).length;
    assert.equal(await markCall(p, origin, 'A', a.slice(100), { batchEnd: highest, before: markOf(a[99]!) }), 100 - byB);
    const ids = await streamIds(p);
    assert.equal(ids.length, 450);
    assert.deepEqual(new Set(ids), new Set([...idsOf(outbox), ...idsOf(later)]), 'each event once');
    assert.equal(await p.admin.hget(guardKeys(p.stream, origin)[0], 'done'), highest);
    assert.equal(await p.admin.exists(guardKeys(p.stream, origin)[1]), 0);

    // An XADD that fails (the key is no stream) adds nothing; the call after it is refused; the retry adds all.
    const last = byPosition(at([[300, 600], [300, 601], [301, 602]]));
    await p.admin.rename(p.stream, `${p.stream}:aside`);
    await p.admin.set(p.stream, 'not a stream');
    await assert.rejects(target.publish(last, context), /WRONGTYPE/);
    await assert.rejects(markCall(p, origin, 'C', last.slice(1), { before: markOf(last[0]!) }), /MAILROOM_ORDER/);
    await p.admin.del(p.stream);
    await p.admin.rename(`${p.stream}:aside`, p.stream);
    await target.publish(last, context);
    assert.deepEqual((await streamIds(p)).slice(450), idsOf(last));
  });

  test("within one attempt, a call goes in only behind the previous call's last event: the guard keeps the attempt's marks in one string and checks its end", async () => {
    const p = await pair();
    const origin = originOf();
    const batch = relayBatch(at(Array.from({ length: 10 }, (_, i): [number, number] => [50, i + 1])), 10);
    const highest = batch.map(markOf).sort().at(-1)!;
    const [state, marks] = guardKeys(p.stream, origin);
    assert.equal(await markCall(p, origin, 'X', batch.slice(0, 5)), 5);
    assert.equal(await p.admin.get(marks), batch.slice(0, 5).map(markOf).join(''), 'the marks added, in order');
    // The sixth event never went in (its call was lost): a call behind it is refused, though earlier events are kept.
    await assert.rejects(markCall(p, origin, 'X', batch.slice(6), { before: markOf(batch[5]!), batchEnd: highest }), /MAILROOM_ORDER/);
    await assert.rejects(markCall(p, origin, 'X', batch.slice(6), { before: markOf(batch[3]!), batchEnd: highest }), /MAILROOM_ORDER/);
    assert.equal(await p.admin.xlen(p.stream), 5, 'nothing added by the refused calls');
    assert.equal(await markCall(p, origin, 'X', batch.slice(5), { before: markOf(batch[4]!), batchEnd: highest }), 5);
    assert.deepEqual(await streamIds(p), idsOf(batch));
    assert.equal(await p.admin.hget(state, 'done'), highest);
    assert.equal(await p.admin.exists(marks), 0, 'the string is deleted after the whole batch');
    // Left part-way by one attempt, the batch retried whole by the next adds only what is missing, and keeps no mark.
    const next = relayBatch(at(Array.from({ length: 10 }, (_, i): [number, number] => [60, i + 20])), 10);
    assert.equal(await markCall(p, origin, 'Y', next.slice(0, 4)), 4);
    assert.equal(await markCall(p, origin, 'Z', next, { before: '', batchEnd: next.map(markOf).sort().at(-1)! }), 6);
    assert.deepEqual(await streamIds(p), idsOf([...batch, ...next]));
    assert.equal(await p.admin.exists(marks), 0);
    assert.equal(await p.admin.hget(state, 'stale'), '0');
  });

  test('with an origin, a batch sent after an event (context.after) adds nothing until that event was added, then goes in behind it', async () => {
    const p = await pair();
    const target = p.target();
    const context = { ...relayContext, origin: originOf() };
    const first = at([[5, 1], [5, 2], [6, 3]]);
    const second = at([[7, 4], [6, 5]]);
    await assert.rejects(target.publish(second, { ...context, after: first.at(-1)! }), /MAILROOM_ORDER/);
    assert.equal(await p.admin.xlen(p.stream), 0, 'nothing added');
    await target.publish(first, context);
    await target.publish(second, { ...context, after: first.at(-1)! });
    assert.deepEqual(await streamIds(p), idsOf([...first, ...second]));
  });

  test('connects on the first publish, and a refused connection names the URL (never the password)', async () => {
    const target = redisStreams({ url: 'redis://app:hunter2@127.0.0.1:1', stream: 'nowhere' }); // nothing listens on port 1
    await assert.rejects(target.publish(events(1), relayContext), (err: Error) => {
      assert.match(err.message, /^redis target: cannot connect to redis:\/\/app:\*\*\*@127\.0\.0\.1:1 \(.*ECONNREFUSED.*\); check that Redis is running/);
      assert.ok(!err.message.includes('hunter2'));
      return true;
    });
    await target.close?.();
  });

  test('rejects while Redis is down and succeeds on the next publish after it is back; a stalled server rejects after ackTimeout', async () => {
    const p = await pair(true);
    const server = p.server!;
    const target = redisStreams({ url: p.url, stream: p.stream, ackTimeout: '400ms' });
    try {
      const first = events(5);
      await target.publish(first, relayContext);
      await server.down();
      await assert.rejects(target.publish(events(5), relayContext), (err: Error) => {
        assert.match(err.message, new RegExp(`cannot connect to redis://127\\.0\\.0\\.1:${server.port}`));
        return true;
      });
      await server.up();
      const second = events(5);
      await target.publish(second, relayContext);
      const ids = (await p.admin.xrange(p.stream, '-', '+')).map(([, f]) => fieldsOf(f).id);
      assert.deepEqual(ids, idsOf([...first, ...second])); // the first batch outlived the restart (AOF)

      server.freeze(true);
      const started = Date.now();
      try {
        await assert.rejects(target.publish(events(5), relayContext), /no reply from .* within 400 ms/);
      } finally {
        server.freeze(false);
      }
      assert.ok(Date.now() - started < 3000);
      const third = events(5);
      await target.publish(third, relayContext);
      await eventually(async () => (await p.admin.xlen(p.stream)) >= 15, 5000, 'the stalled batch to land');
    } finally {
      await target.close?.();
    }
  });
});

const relayedNote = defineEvent<{ n: number }>('redis.note-taken', { version: 1 });
/** Flushes until `count` events were delivered: another test's open transaction on the server holds them back for a while. */
async function flushAll(relay: { flush(): Promise<Record<string, { delivered: number }>> }, count: number): Promise<void> {
  let delivered = 0;
  const deadline = Date.now() + 20_000;
  while (delivered < count) {
    if (Date.now() > deadline) throw new Error(`the relay delivered ${delivered} of ${count} events in 20 s`);
    delivered += Object.values(await relay.flush())[0]!.delivered;
    if (delivered < count) await settle(50);
  }
  assert.equal(delivered, count);
}
for (const db of testDatabases()) {
  describe(`redis target behind the relay on ${db.name}`, { skip }, () => {
    test('the relay names its outbox: a batch published again after a crash before the cursor moved is not added twice, and no key per event is kept', async () => {
      const p = await pair();
      const t = await db.open();
      for (let n = 1; n <= 30; n++) await t.mailroom.publish(relayedNote, { n }, { key: `k${n % 3}` });
      const relay = t.mailroom.relay({ internal: false, to: [p.target()], batchSize: 8 });
      await flushAll(relay, 30);
      await relay.stop();
      // As if the relay had died after Redis took every batch and before its cursor's commit.
      await t.sql(`UPDATE "${t.schema}".relay_cursors SET cursor_xid = '0', cursor_position = 0`);
      const again = t.mailroom.relay({ internal: false, to: [p.target()], batchSize: 12 });
      await flushAll(again, 30); // the relay published all 30 again
      await again.stop();
      const entries = (await p.admin.xrange(p.stream, '-', '+')).map(([, f]) => fieldsOf(f));
      assert.deepEqual(entries.map((f) => (JSON.parse(f.body!) as { data: { n: number } }).data.n), Array.from({ length: 30 }, (_, i) => i + 1));
      const keys = await p.admin.keys(`*${p.stream}*`);
      assert.ok(!keys.some((k) => k.includes(":mailroom:dedup:")), `no key per event: ${keys.length} keys, e.g. ${keys.slice(0, 3).join(", ")}`);
      const state = keys.find((k) => /:mailroom:relayed:\d+:\d+:\d+$/.test(k));
      assert.ok(state, `the guard's state under the outbox's name: ${keys.join(', ')}`);
      assert.equal(await p.admin.exists(`${state}:marks`), 0, 'no marks kept past whole batches');
    });

    test('a failure to read which outbox it is, other than a missing privilege, is not kept: once the database answers, the batches are guarded by their place', async () => {
      const p = await pair();
      const t = await db.open();
      for (let n = 1; n <= 5; n++) await t.mailroom.publish(relayedNote, { n });
      const relay = t.mailroom.relay({ internal: false, to: [p.target()] });
      await t.sql(`ALTER TABLE "${t.schema}".outbox RENAME TO outbox_away`); // the origin's statement fails: no such table
      try {
        await assert.rejects(relay.check(), /outbox/);
      } finally {
        await t.sql(`ALTER TABLE "${t.schema}".outbox_away RENAME TO outbox`);
      }
      await flushAll(relay, 5);
      await relay.stop();
      const keys = await p.admin.keys(`*${p.stream}*`);
      assert.ok(!keys.some((k) => k.includes(':mailroom:dedup:')), `guarded by place, not by id: ${keys.length} keys, e.g. ${keys.slice(0, 3).join(', ')}`);
      assert.ok((await relay.check()).every((w) => w.code !== 'redis-guard-by-id'));
    });

    test("the relay tells its targets' checks which outbox it is", async () => {
      const t = await db.open();
      let origin: string | null | undefined;
      const probe = { name: 'probe', readAhead: true, publish: async () => {}, check: async (c: { origin?: string | null }) => ((origin = c.origin), []) };
      const relay = t.mailroom.relay({ internal: false, to: [probe] });
      assert.deepEqual(await relay.check(), []);
      assert.match(String(origin), /^\d+:\d+:\d+$/);
    });
  });
}

describe("redis target behind a relay whose database role may not call pg_control_system()", { skip: skip || (!databaseUrl && 'set TEST_DATABASE_URL') }, () => {
  test('the relay warns (redis-guard-by-id) and guards by event id: its batches published again are still added once', async () => {
    const p = await pair();
    const name = `mr_noctl_${process.pid}`; // the database and its owner, a role that is not a superuser
    const asAdmin = async (database: string, statements: string[]) => {
      const client = new pg.Client({ connectionString: withDatabase(databaseUrl!, database) });
      await client.connect();
      try {
        for (const text of statements) await client.query(text);
      } finally {
        await client.end();
      }
    };
    await dropDatabase(databaseUrl!, name);
    await asAdmin('postgres', [`DROP ROLE IF EXISTS ${name}`, `CREATE ROLE ${name} LOGIN`]);
    await createDatabase(databaseUrl!, name);
    await asAdmin('postgres', [`ALTER DATABASE ${name} OWNER TO ${name}`]);
    await asAdmin(name, ['REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC']);
    const url = new URL(withDatabase(databaseUrl!, name));
    url.username = name;
    const mailroom = await createMailroom({ database: url.toString(), schema: 'mailroom' });
    try {
      await mailroom.migrate();
      for (let n = 1; n <= 10; n++) await mailroom.publish(relayedNote, { n });
      const relay = mailroom.relay({ internal: false, to: [p.target()] });
      assert.ok((await relay.check()).some((w) => w.code === 'redis-guard-by-id'), 'the relay warns that its batches are guarded by event id');
      await flushAll(relay, 10);
      await relay.stop();
      await asAdmin(name, [`UPDATE mailroom.relay_cursors SET cursor_xid = '0', cursor_position = 0`]);
      const again = mailroom.relay({ internal: false, to: [p.target()] });
      await flushAll(again, 10);
      await again.stop();
      assert.equal(await p.admin.xlen(p.stream), 10, 'added once');
      const keys = await p.admin.keys(`*${p.stream}*`);
      assert.equal(keys.filter((k) => k.includes(':mailroom:dedup:')).length, 10, 'a dedup key per event');
      assert.ok(!keys.some((k) => k.includes(':mailroom:relayed:')), 'no guard state by place');
    } finally {
      await mailroom.close();
      await dropDatabase(databaseUrl!, name);
      await asAdmin('postgres', [`DROP ROLE IF EXISTS ${name}`]);
    }
  });
});

describe('redis source', { skip }, () => {
  test('delivers id, headers, body and origin; an acked entry is not delivered again', async () => {
    const p = await pair();
    const batch = events(3);
    await p.target().publish(batch, relayContext);
    const one = recorder();
    const source = p.source();
    assert.equal(source.kind, 'redis');
    assert.equal(source.name, p.stream);
    await source.start(one.deliver, one.context);
    try {
      await eventually(() => one.messages.length === 3, 5000, 'three deliveries');
      assert.deepEqual(messageIds(one.messages), idsOf(batch));
      const m = one.messages[0]!;
      assert.deepEqual(JSON.parse(Buffer.from(m.body as Uint8Array).toString('utf8')), batch[0]!.envelope);
      assert.equal(m.headers?.['content-type'], CLOUDEVENTS_CONTENT_TYPE);
      assert.equal(m.headers?.traceparent, TRACEPARENT);
      assert.equal(m.headers?.id, batch[0]!.envelope.id);
      assert.equal(m.headers?.body, undefined);
      assert.match(m.origin, new RegExp(`^redis stream ${p.stream}, group ${p.group}, entry \\d+-\\d+$`));
      await Promise.all(one.messages.map((x) => x.ack()));
    } finally {
      await source.stop();
    }
    assert.equal(await p.pending(), 0);
    const later = events(1);
    await p.target().publish(later, relayContext);
    const two = recorder();
    const again = p.source();
    await again.start(two.deliver, two.context);
    try {
      await eventually(() => two.messages.length >= 1, 5000, 'the new event');
      await settle(200);
      assert.deepEqual(messageIds(two.messages), idsOf(later));
      await two.messages[0]!.ack();
    } finally {
      await again.stop();
    }
    assert.equal(await p.pending(), 0);
  });

  test('an entry left unacknowledged goes to another consumer: handed back on stop at once, or claimed with XAUTOCLAIM after claimIdle', async () => {
    const p = await pair();
    const batch = events(4);
    await p.target().publish(batch, relayContext);
    const first = recorder();
    const a = redisSource({ url: p.url, stream: p.stream, group: p.group, consumer: 'a', claimIdle: '60s' });
    await a.start(first.deliver, first.context);
    await eventually(() => first.messages.length === 4, 5000, 'four deliveries');
    await first.messages[0]!.ack();
    await a.stop();
    assert.equal(await p.pending(), 3);

    // Handed back on stop: taken by the first claim round of a consumer whose claimIdle is 30 s.
    const second = recorder();
    const b = redisSource({ url: p.url, stream: p.stream, group: p.group, consumer: 'b', claimIdle: '30s' });
    await b.start(second.deliver, second.context);
    try {
      await eventually(() => second.messages.length === 3, 3000, 'the handed-back entries');
      assert.deepEqual(messageIds(second.messages), idsOf(batch.slice(1)));
      assert.match(second.messages[0]!.origin, /claimed: idle over 30000 ms/);
      await Promise.all(second.messages.map((m) => m.ack()));
    } finally {
      await b.stop();
    }
    assert.equal(await p.pending(), 0);

    // An entry read by a consumer that died without a word (read with the plain client, never acked).
    const dead = events(1);
    await p.target().publish(dead, relayContext);
    await p.admin.xreadgroup('GROUP', p.group, 'dead', 'COUNT', 10, 'STREAMS', p.stream, '>');
    const third = recorder();
    const c = redisSource({ url: p.url, stream: p.stream, group: p.group, consumer: 'c', claimIdle: '1s' });
    const started = Date.now();
    await c.start(third.deliver, third.context);
    try {
      await eventually(() => third.messages.length === 1, 5000, 'the dead consumer entry');
      assert.ok(Date.now() - started >= 800, `claimed after ${Date.now() - started} ms`);
      assert.equal(third.messages[0]!.messageId, dead[0]!.envelope.id);
      assert.match(third.messages[0]!.origin, /claimed: idle over 1000 ms/);
      await third.messages[0]!.ack();
    } finally {
      await c.stop();
    }
    assert.equal(await p.pending(), 0);
  });

  test('a consumer that comes back under its name gets its own pending entries first', async () => {
    const p = await pair();
    const batch = events(3);
    await p.target().publish(batch, relayContext);
    await p.admin.xreadgroup('GROUP', p.group, 'same', 'COUNT', 10, 'STREAMS', p.stream, '>');
    const later = events(2);
    await p.target().publish(later, relayContext);
    const r = recorder();
    const source = redisSource({ url: p.url, stream: p.stream, group: p.group, consumer: 'same' });
    await source.start(r.deliver, r.context);
    try {
      await eventually(() => r.messages.length === 5, 5000, 'five deliveries');
      assert.deepEqual(messageIds(r.messages), idsOf([...batch, ...later]));
      await Promise.all(r.messages.map((m) => m.ack()));
    } finally {
      await source.stop();
    }
    assert.equal(await p.pending(), 0);
  });

  test("a new group starts at the stream's end with from: 'now' (default) and at its start with 'earliest'", async () => {
    const p = await pair();
    const old = events(2);
    await p.target().publish(old, relayContext);
    const now = recorder();
    const earliest = recorder();
    const fromNow = redisSource({ url: p.url, stream: p.stream, group: `${p.group}-now` });
    const fromStart = redisSource({ url: p.url, stream: p.stream, group: `${p.group}-earliest`, from: 'earliest' });
    await fromNow.start(now.deliver, now.context);
    await fromStart.start(earliest.deliver, earliest.context);
    try {
      const fresh = events(1);
      await p.target().publish(fresh, relayContext);
      await eventually(() => now.messages.length === 1 && earliest.messages.length === 3, 5000, 'deliveries');
      assert.deepEqual(messageIds(now.messages), idsOf(fresh));
      assert.deepEqual(messageIds(earliest.messages), idsOf([...old, ...fresh]));
      await Promise.all([...now.messages, ...earliest.messages].map((m) => m.ack()));
    } finally {
      await Promise.all([fromNow.stop(), fromStart.stop()]);
    }
  });

  test('a pending entry deleted from the stream is reported and taken off the pending list', async () => {
    const p = await pair();
    const batch = events(3);
    await p.target().publish(batch, relayContext);
    const read = (await p.admin.xreadgroup('GROUP', p.group, 'same', 'COUNT', 10, 'STREAMS', p.stream, '>')) as [string, [string, string[]][]][];
    const gone = read[0]![1][1]![0];
    await p.admin.xdel(p.stream, gone);
    const r = recorder();
    const source = redisSource({ url: p.url, stream: p.stream, group: p.group, consumer: 'same' });
    await source.start(r.deliver, r.context);
    try {
      await eventually(() => r.messages.length === 2, 5000, 'two deliveries');
      assert.deepEqual(messageIds(r.messages), idsOf([batch[0]!, batch[2]!]));
      await eventually(() => r.reports.length === 1, 5000, 'the report');
      assert.match((r.reports[0] as Error).message, new RegExp(`entries ${gone} of stream ${p.stream} were deleted`));
      await Promise.all(r.messages.map((m) => m.ack()));
    } finally {
      await source.stop();
    }
    assert.equal(await p.pending(), 0);
  });

  test('prefetch bounds the delivered, unacknowledged entries', async () => {
    const p = await pair();
    const batch = events(20);
    await p.target().publish(batch, relayContext);
    const r = recorder();
    const source = p.source({ prefetch: 5 });
    await source.start(r.deliver, r.context);
    try {
      await eventually(() => r.messages.length === 5, 5000, 'five deliveries');
      await settle(300);
      assert.equal(r.messages.length, 5);
      await r.messages[0]!.ack();
      await r.messages[1]!.ack();
      await eventually(() => r.messages.length === 7, 5000, 'two more');
      await settle(300);
      assert.equal(r.messages.length, 7);
      let acked = 2;
      while (acked < 20) {
        const upTo = r.messages.length;
        await Promise.all(r.messages.slice(acked, upTo).map((m) => m.ack()));
        acked = upTo;
        if (acked < 20) await eventually(() => r.messages.length > acked, 5000, 'more deliveries');
      }
      assert.deepEqual(messageIds(r.messages), idsOf(batch));
    } finally {
      await source.stop();
    }
    assert.equal(await p.pending(), 0);
  });

  test('an entry without a body field is delivered with an empty body; raw ids and headers come through', async () => {
    const p = await pair();
    const raw = await p.raw();
    try {
      await raw.publish('{"not":"a cloud event"}', { messageId: 'raw-1', headers: { 'X-Custom': 'yes' } });
      await p.admin.xadd(p.stream, '*', 'id', 'raw-2', 'type', 'weird');
    } finally {
      await raw.close();
    }
    const r = recorder();
    const source = p.source();
    await source.start(r.deliver, r.context);
    try {
      await eventually(() => r.messages.length === 2, 5000, 'two deliveries');
      assert.equal(r.messages[0]!.messageId, 'raw-1');
      assert.equal(r.messages[0]!.headers?.['x-custom'], 'yes');
      assert.equal(Buffer.from(r.messages[0]!.body as Uint8Array).toString(), '{"not":"a cloud event"}');
      assert.equal(r.messages[1]!.messageId, 'raw-2');
      assert.equal((r.messages[1]!.body as Uint8Array).length, 0);
      await Promise.all(r.messages.map((m) => m.ack()));
    } finally {
      await source.stop();
    }
  });

  test('ack and nack never throw once the source stopped or its connection died', async () => {
    const p = await pair(true); // a private server: CLIENT KILL below must not hit anyone else
    await p.target().publish(events(3), relayContext);
    const r = recorder();
    const source = p.source();
    await source.start(r.deliver, r.context);
    await eventually(() => r.messages.length === 3, 5000, 'three deliveries');
    await p.admin.call('CLIENT', ['KILL', 'TYPE', 'normal', 'SKIPME', 'yes']); // every connection but the admin's
    await r.messages[0]!.ack();
    await source.stop();
    await r.messages[1]!.ack();
    await r.messages[2]!.nack();
    assert.ok((await p.pending()) >= 2);
  });

  test('reconnects after a broker restart and goes on delivering; an ack made while Redis was down is sent after the reconnect', async () => {
    const p = await pair(true);
    const target = p.target();
    const before = events(3);
    await target.publish(before, relayContext);
    const r = recorder();
    const source = p.source();
    await source.start(r.deliver, r.context);
    try {
      await eventually(() => r.messages.length === 3, 5000, 'three deliveries');
      await r.messages[0]!.ack();
      await p.server!.down();
      await r.messages[1]!.ack(); // Redis is down: kept, and sent after the reconnect
      await p.server!.up();
      await p.restart();
      const afterRestart = events(3);
      await eventually(
        async () => {
          try {
            await target.publish(afterRestart, relayContext);
            return true;
          } catch {
            return false;
          }
        },
        10_000,
        'a publish after the restart',
      );
      await eventually(() => r.messages.length === 6, 10_000, 'deliveries after the restart');
      await settle(200);
      // Neither the one acked during the outage nor the one still with mailroom is delivered twice.
      assert.deepEqual(messageIds(r.messages), idsOf([...before, ...afterRestart]));
      assert.ok(r.reports.length >= 1, 'the lost connection was reported');
      assert.match(String((r.reports[0] as Error).message), new RegExp(`^redis source: reading stream ${p.stream}, group ${p.group} on ${p.url} failed: .*; retrying in 100 ms$`));
      await Promise.all(r.messages.slice(2).map((m) => m.ack()));
      await eventually(async () => (await groupPending(p)) === 0, 5000, 'acks after the restart');
    } finally {
      await source.stop();
    }
  });

  test('keeps trying while the server is down at start, reporting each failure, and delivers once it is up', async () => {
    const p = await pair(true);
    await p.target().publish(events(1), relayContext);
    await p.server!.down();
    const r = recorder();
    const source = p.source();
    const started = Date.now();
    await source.start(r.deliver, r.context); // resolves after the first attempt
    try {
      assert.ok(Date.now() - started < 2000);
      await eventually(() => r.reports.length >= 3, 5000, 'three reported failures');
      assert.match(String((r.reports[0] as Error).message), new RegExp(`cannot connect to ${p.url}.*retrying in 100 ms`));
      assert.match(String((r.reports[1] as Error).message), /retrying in 200 ms/);
      await p.server!.up();
      await eventually(() => r.messages.length === 1, 10_000, 'the delivery once the server is up');
      await r.messages[0]!.ack();
    } finally {
      await source.stop();
    }
  });

  test('forgets consumers that hold nothing and stopped reading; falls back to the mailroom group name', async () => {
    const p = await pair();
    await p.admin.call('XGROUP', ['CREATECONSUMER', p.stream, p.group, 'ghost']);
    await settle(450);
    const r = recorder(p.group);
    const source = redisSource({ url: p.url, stream: p.stream, claimIdle: '200ms' }); // group: context.group
    await source.start(r.deliver, r.context);
    try {
      await eventually(async () => !(await consumerNames(p)).includes('ghost'), 5000, 'ghost removed');
      await p.target().publish(events(1), relayContext);
      await eventually(() => r.messages.length === 1, 5000, 'a delivery');
      await r.messages[0]!.ack();
    } finally {
      await source.stop();
    }
  });
});

async function groupPending(p: RedisPair): Promise<number> {
  const summary = (await p.admin.xpending(p.stream, p.group)) as [number, ...unknown[]];
  return Number(summary[0]);
}

async function consumerNames(p: RedisPair): Promise<string[]> {
  const list = (await p.admin.call('XINFO', ['CONSUMERS', p.stream, p.group])) as unknown[][];
  return list.map((item) => String(item[1]));
}

describe('redis safety checks', { skip }, () => {
  const codes = (warnings: SafetyWarning[]) => warnings.map((w) => w.code).sort();

  test('redis-no-persistence fires on a server that keeps nothing on disk and not on one with AOF', async () => {
    const shared = await pair();
    const target = shared.target();
    const warnings = await target.check!({ republishHorizonMs: 60_000 });
    assert.deepEqual(codes(warnings), ['redis-no-persistence']);
    assert.equal(warnings[0]!.subject, `redis ${shared.url} stream ${shared.stream}`);
    assert.match(warnings[0]!.message, /appendonly/);
    assert.deepEqual(codes(await shared.source().check!()), ['redis-no-persistence']);

    const durable = await pair(true);
    assert.deepEqual(await durable.target().check!({ republishHorizonMs: 60_000 }), []);
    assert.deepEqual(await durable.source().check!(), []);
  });

  test('redis-eviction fires with maxmemory and an evicting policy, not with noeviction', async () => {
    const p = await pair(true);
    const target = p.target();
    await p.admin.config('SET', 'maxmemory', '100mb');
    assert.deepEqual(codes(await target.check!({ republishHorizonMs: 60_000 })), []); // noeviction
    await p.admin.config('SET', 'maxmemory-policy', 'allkeys-lru');
    const warnings = await target.check!({ republishHorizonMs: 60_000 });
    assert.deepEqual(codes(warnings), ['redis-eviction']);
    assert.match(warnings[0]!.message, /allkeys-lru.*the stream included/);
    assert.deepEqual(codes(await p.source().check!()), ['redis-eviction']);
    await p.admin.config('SET', 'maxmemory-policy', 'volatile-ttl');
    assert.match((await target.check!({ republishHorizonMs: 60_000 }))[0]!.message, /dedup keys/);
    await p.admin.config('SET', 'maxmemory', '0');
    assert.deepEqual(await target.check!({ republishHorizonMs: 60_000 }), []);
  });

  test('redis-dedup-window fires when the window is shorter than the republish horizon', async () => {
    const p = await pair(true);
    const short = redisStreams({ url: p.url, stream: p.stream, dedupWindow: '10m' });
    try {
      const warnings = await short.check!({ republishHorizonMs: 3_600_000 });
      assert.deepEqual(codes(warnings), ['redis-dedup-window']);
      assert.match(warnings[0]!.message, /at least 3600000 ms/);
      assert.deepEqual(await short.check!({ republishHorizonMs: 600_000 }), []);
      assert.deepEqual(await p.target().check!({ republishHorizonMs: 3_600_000 }), []); // default 24h
    } finally {
      await short.close?.();
    }
  });

  test("redis-guard-by-id fires when the relay's database did not say which outbox it is, and only then", async () => {
    const p = await pair(true);
    const target = p.target();
    const warnings = await target.check!({ republishHorizonMs: 60_000, origin: null });
    assert.deepEqual(codes(warnings), ['redis-guard-by-id']);
    assert.match(warnings[0]!.message, /pg_control_system\(\).*dedup key.*GRANT EXECUTE/);
    assert.deepEqual(await target.check!({ republishHorizonMs: 60_000, origin: '1:2:3' }), []);
    assert.deepEqual(await target.check!({ republishHorizonMs: 60_000 }), [], 'unknown (mailroom doctor): no warning');
  });

  test('redis-config-unreadable fires when CONFIG is not allowed, and only then', async () => {
    const p = await pair(true);
    await p.admin.call('ACL', ['SETUSER', 'limited', 'on', '>secret', '~*', '&*', '+@all', '-config']);
    const limitedUrl = `redis://limited:secret@127.0.0.1:${p.server!.port}`;
    const target = redisStreams({ url: limitedUrl, stream: p.stream });
    try {
      const warnings = await target.check!({ republishHorizonMs: 60_000 });
      assert.deepEqual(codes(warnings), ['redis-config-unreadable']);
      assert.equal(warnings[0]!.subject, `redis redis://limited:***@127.0.0.1:${p.server!.port} stream ${p.stream}`);
      assert.ok(!JSON.stringify(warnings).includes('secret'));
      assert.deepEqual(codes(await redisSource({ url: limitedUrl, stream: p.stream }).check!()), ['redis-config-unreadable']);
      await target.publish(events(1), relayContext); // the user can still publish
    } finally {
      await target.close?.();
    }
  });
});

describe('redis command encoding', () => {
  test('respOf writes RESP bulk strings with byte lengths (not character counts), numbers as text, short and long arguments alike', () => {
    assert.equal(respOf('GET', ['orders']).toString('latin1'), '*2\r\n$3\r\nGET\r\n$6\r\norders\r\n');
    const long = 'ü'.repeat(40); // 80 bytes: written apart from the text around it
    const encoded = respOf('EVALSHA', ['é', 17, long, '', 'tail']);
    assert.equal(encoded.toString('utf8'), `*6\r\n$7\r\nEVALSHA\r\n$2\r\né\r\n$2\r\n17\r\n$80\r\n${long}\r\n$0\r\n\r\n$4\r\ntail\r\n`);
    assert.equal(encoded.length, Buffer.byteLength(encoded.toString('utf8')));
    // Byte lengths with more digits than the character counts ('é'.repeat(5): 5 characters, 10 bytes),
    // lengths at the digit boundaries (9 and 10), a long ASCII argument and a number.
    const args = ['a'.repeat(9), 'a'.repeat(10), 'é'.repeat(5), 'é'.repeat(50), '😀'.repeat(30), 'x'.repeat(1000), 'é'.repeat(400), 1234567];
    const expected = `*${args.length + 1}\r\n` + ['X', ...args.map(String)].map((text) => `$${Buffer.byteLength(text)}\r\n${text}\r\n`).join('');
    assert.equal(respOf('X', args).toString('utf8'), expected);
    assert.equal(respOf('X', args).length, Buffer.byteLength(expected));
  });
});

describe('redis options', () => {
  const invalid = (fn: () => unknown, path: string, pattern: RegExp) =>
    assert.throws(fn, (err: unknown) => {
      assert.ok(err instanceof ValidationError, `expected a ValidationError, got ${String(err)}`);
      assert.equal(err.issues[0]?.path, path);
      assert.match(err.message, pattern);
      return true;
    });
  const ok = { url: 'redis://127.0.0.1:6379', stream: 'orders' };

  test('bad target options throw a ValidationError naming the option', () => {
    invalid(() => redisStreams(undefined as never), 'options', /redisStreams needs an options object/);
    invalid(() => redisStreams({ stream: 'orders' } as never), 'url', /^redis: url must be a non-empty string/);
    invalid(() => redisStreams({ ...ok, url: 'http://127.0.0.1:6379' }), 'url', /redis:\/\/ or rediss:\/\//);
    invalid(() => redisStreams({ ...ok, url: 'not a url' }), 'url', /is not a URL/);
    invalid(() => redisStreams({ ...ok, stream: '' }), 'stream', /^redis: stream must be a non-empty string/);
    invalid(() => redisStreams({ ...ok, stream: 'a}b' }), 'stream', /hash tag/);
    invalid(() => redisStreams({ ...ok, stream: 'with space' }), 'stream', /without spaces/);
    invalid(() => redisStreams({ ...ok, stream: '{orders}' }), 'name', /default target name/);
    invalid(() => redisStreams({ ...ok, name: 'bad name' }), 'name', /name must be 1-128/);
    invalid(() => redisStreams({ ...ok, maxLen: 0 }), 'maxLen', /maxLen must be a whole number/);
    invalid(() => redisStreams({ ...ok, dedupWindow: '500ms' }), 'dedupWindow', /at least 1s/);
    invalid(() => redisStreams({ ...ok, dedupWindow: 'soon' as never }), 'dedupWindow', /not a duration/);
    invalid(() => redisStreams({ ...ok, ackTimeout: -1 }), 'ackTimeout', /ackTimeout/);
    assert.equal(redisStreams({ ...ok, stream: '{orders}', name: 'orders' }).name, 'orders');
    assert.equal(redisStreams({ ...ok, url: 'rediss://user:pw@cache.example:6380/2' }).name, 'redis:orders');
  });

  test('bad source options throw a ValidationError naming the option', () => {
    invalid(() => redisSource({ stream: 'orders' } as never), 'url', /url must be/);
    invalid(() => redisSource({ ...ok, stream: 7 } as never), 'stream', /stream must be/);
    invalid(() => redisSource({ ...ok, prefetch: 0 }), 'prefetch', /prefetch must be a whole number from 1/);
    invalid(() => redisSource({ ...ok, prefetch: 1.5 }), 'prefetch', /prefetch/);
    invalid(() => redisSource({ ...ok, claimIdle: '10ms' }), 'claimIdle', /at least 100ms/);
    invalid(() => redisSource({ ...ok, from: 'latest' as never }), 'from', /'now' or 'earliest'/);
    invalid(() => redisSource({ ...ok, group: '' }), 'group', /group must be/);
    invalid(() => redisSource({ ...ok, consumer: 'a b' }), 'consumer', /consumer must be/);
  });
});

describe('redis fixture and ceiling', { skip }, () => {
  test('pending() counts unread and unacknowledged entries; sourceFrom(describe()) reads the same group', async () => {
    const p = await pair();
    await p.target().publish(events(4), relayContext);
    assert.equal(await p.pending(), 4);
    const r = recorder('ignored');
    const source = fixture.sourceFrom(p.describe(), { prefetch: 2 });
    await source.start(r.deliver, r.context);
    try {
      await eventually(() => r.messages.length === 2, 5000, 'two deliveries');
      await r.messages[0]!.ack();
      await eventually(() => r.messages.length === 3, 5000, 'a third');
    } finally {
      await source.stop();
    }
    assert.equal(await p.pending(), 3);
  });

  test('the ceiling benchmark publishes with replies and cleans up', async () => {
    const result = await ceiling({ url: url!, messages: 200 });
    assert.equal(result.messages, 200);
    assert.ok(result.perSecond > 0 && result.seconds > 0);
    const client = new Redis(url!);
    try {
      assert.deepEqual(await client.keys(`mailroom-ceiling-${process.pid}-*`), []);
    } finally {
      client.disconnect();
    }
  });
});


