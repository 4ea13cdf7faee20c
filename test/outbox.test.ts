/**
 * The transactional outbox: defineEvent, publish in the caller's transaction
 * (committed: one row; rolled back: none; ended: refused), the CloudEvents
 * envelope (checked by the official SDK), and bad input that writes nothing.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { CloudEvent } from 'cloudevents';
import { z } from 'zod';
import { defineEvent, TransactionEndedError, ValidationError, type CloudEventEnvelope, type RelayTarget } from '../src/index.ts';
import { imperativeVerbOf } from '../src/events/event-type.ts';
import { testDatabases, type TestMailroom } from './helpers/databases.ts';
import { flushUntil } from './helpers/relay.ts';

const orderPlaced = defineEvent('outbox.order-placed', { version: 1, schema: z.object({ orderId: z.string(), total: z.number().int() }) });
const noted = defineEvent<{ n: number }>('outbox.noted', { version: 3, source: 'https://shop.example/notes' });

/** A relay target that keeps what it is given: the wire form, as a broker would get it. */
function capture(): RelayTarget & { envelopes: CloudEventEnvelope[] } {
  const envelopes: CloudEventEnvelope[] = [];
  return { name: 'capture', envelopes, publish: async (events) => void envelopes.push(...events.map((e) => e.envelope)) };
}

async function outboxCount(t: TestMailroom): Promise<number> {
  const [row] = await t.sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${t.schema}".outbox`);
  return row!.n;
}

describe('defineEvent', () => {
  it('accepts lower-case dotted names and rejects others, naming the type', () => {
    for (const bad of ['OrderCreated', 'order', 'order..created', 'order.Created', '1order.created', 'order.created.', '', 'a'.repeat(120) + '.created1234']) {
      assert.throws(() => defineEvent(bad, { version: 1 }), (e: unknown) => e instanceof ValidationError && e.message.includes(JSON.stringify(bad)), bad);
    }
    assert.throws(() => defineEvent('send-email', { version: 1 }), /not valid.*reads as a command \("send"\)/);
  });

  it('warns once per type when the name reads as a command, and not for facts', (t) => {
    const warn = t.mock.method(console, 'warn', () => {});
    defineEvent('create.order', { version: 1 });
    defineEvent('create.order', { version: 1 });
    defineEvent('order.send-email', { version: 1 });
    defineEvent('order.created', { version: 1 });
    defineEvent('charge.succeeded', { version: 1 });
    defineEvent('email.sent', { version: 1 });
    const messages = warn.mock.calls.map((c) => String(c.arguments[0]));
    assert.equal(messages.length, 2, messages.join('\n'));
    assert.match(messages[0]!, /"create\.order" reads as a command \("create"\).*past tense, e\.g\. "order\.created"/);
    assert.match(messages[1]!, /"order\.send-email" reads as a command \("send"\)/);
    assert.equal(imperativeVerbOf('order.update'), 'update');
    assert.equal(imperativeVerbOf('order.updated'), undefined);
  });

  it('needs a positive integer version; the same type and version with another schema is an error', () => {
    assert.throws(() => defineEvent('outbox.versioned', { version: 0 }), /version must be a positive integer, got 0/);
    assert.throws(() => defineEvent('outbox.versioned', { version: 1.5 }), /version must be a positive integer/);
    assert.throws(() => defineEvent('outbox.versioned', { version: 1, source: 'has space' }), /source must be a non-empty URI reference/);
    const first = defineEvent('outbox.versioned', { version: 1, schema: z.object({ a: z.string() }) });
    assert.throws(() => defineEvent('outbox.versioned', { version: 1, schema: z.object({ b: z.string() }) }), /outbox\.versioned version 1 is already defined with a different schema/);
    const again = defineEvent('outbox.versioned', { version: 1, schema: first.schema! });
    assert.equal(again, first);
    assert.equal(defineEvent('outbox.versioned', { version: 2 }).version, 2, 'a new version beside the old');
  });
});

for (const db of testDatabases()) {
  describe(`outbox on ${db.name}`, () => {
    it('publish writes one row in the caller\'s transaction: committed ones exist, rolled-back ones never do', async () => {
      const t = await db.open();
      const { mailroom } = t;
      const committed = await mailroom.transaction(async (tx) => (await mailroom.publish(orderPlaced, { orderId: 'o1', total: 5 }, { tx, key: 'o1' })).id);
      await assert.rejects(
        mailroom.transaction(async (tx) => {
          await mailroom.publish(orderPlaced, { orderId: 'o2', total: 5 }, { tx, key: 'o2' });
          throw new Error('business rule failed');
        }),
        /business rule failed/,
      );
      // The driver's own transaction handle.
      const handle = await db.handle();
      let native: string;
      let rolledBackNative: string;
      if (handle instanceof PGlite) {
        native = await handle.transaction(async (tx) => (await mailroom.publish(noted, { n: 1 }, { tx })).id);
        rolledBackNative = await handle.transaction(async (tx) => {
          const { id } = await mailroom.publish(noted, { n: 2 }, { tx });
          await tx.rollback();
          return id;
        });
      } else {
        const client = await (handle as pg.Pool).connect();
        try {
          await client.query('BEGIN');
          native = (await mailroom.publish(noted, { n: 1 }, { tx: client })).id;
          await client.query('COMMIT');
          await client.query('BEGIN');
          rolledBackNative = (await mailroom.publish(noted, { n: 2 }, { tx: client })).id;
          await client.query('ROLLBACK');
        } finally {
          client.release();
        }
      }
      const direct = (await mailroom.publish(noted, { n: 3 })).id;
      const rows = await t.sql<{ id: string; type: string; subject: string | null; position: string }>(
        `SELECT id, type, subject, position::text AS position FROM "${t.schema}".outbox ORDER BY position`,
      );
      assert.deepEqual(rows.map((r) => r.id), [committed, native, direct]);
      assert.ok(!rows.some((r) => r.id === rolledBackNative));
      assert.deepEqual(rows.map((r) => r.subject), ['o1', null, null]);
      const many = await mailroom.publishMany(noted, [{ n: 10 }, { n: 11 }, { n: 12 }], { key: (d) => `k${d.n % 2}` });
      assert.equal(many.ids.length, 3);
      const keyed = await t.sql<{ subject: string }>(`SELECT subject FROM "${t.schema}".outbox WHERE id = ANY($1::uuid[]) ORDER BY position`, [many.ids]);
      assert.deepEqual(keyed.map((r) => r.subject), ['k0', 'k1', 'k0'], 'publishMany keeps input order');
    });

    it('positions follow the publish order with and without keys; a keyed row still records its key\'s previous row', async () => {
      const t = await db.open();
      const { mailroom } = t;
      const ids: string[] = [];
      await mailroom.transaction(async (tx) => {
        ids.push(...(await mailroom.publishMany(noted, [{ n: 1 }, { n: 2 }, { n: 3 }], { tx })).ids);
        ids.push((await mailroom.publish(noted, { n: 4 }, { tx, key: 'k' })).id);
        ids.push(...(await mailroom.publishMany(noted, [{ n: 5 }, { n: 6 }], { tx })).ids);
        ids.push(...(await mailroom.publishMany(noted, [{ n: 7 }, { n: 8 }], { tx, key: () => 'k' })).ids);
      });
      const rows = await t.sql<{ id: string; position: string; prev_position: string | null }>(
        `SELECT id, position::text AS position, prev_position::text AS prev_position FROM "${t.schema}".outbox ORDER BY position`,
      );
      assert.deepEqual(rows.map((r) => r.id), ids, 'positions in publish order, keyed or not');
      const position = (i: number) => rows[i]!.position;
      assert.deepEqual(rows.map((r) => r.prev_position), [null, null, null, '0', null, null, position(3), position(6)], 'each keyed row names the one before it; rows without a key none');
    });

    it('the envelope is CloudEvents 1.0 structured JSON and passes the official SDK\'s strict validation', async () => {
      const t = await db.open({ source: '/shop/orders' });
      const { mailroom } = t;
      const time = new Date('2026-03-01T10:00:00.123Z');
      const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
      const a = await mailroom.publish(orderPlaced, { orderId: 'o1', total: 42 }, { key: 'order-1', correlationId: 'req-7', causationId: 'cmd-3', traceparent, time, headers: { tenant: 'acme' } });
      const b = await mailroom.publish(noted, { n: 1 });
      const target = capture();
      const relay = mailroom.relay({ internal: false, to: [target] });
      await flushUntil(relay, 2, 'capture');
      await relay.stop();
      const [first, second] = target.envelopes;
      assert.deepEqual(first, {
        specversion: '1.0',
        id: a.id,
        source: '/shop/orders',
        type: 'outbox.order-placed',
        time: '2026-03-01T10:00:00.123Z',
        datacontenttype: 'application/json',
        dataschema: 'urn:mailroom:outbox.order-placed:v1',
        subject: 'order-1',
        partitionkey: 'order-1',
        correlationid: 'req-7',
        causationid: 'cmd-3',
        traceparent,
        tenant: 'acme',
        data: { orderId: 'o1', total: 42 },
      });
      assert.equal(second?.id, b.id);
      assert.equal(second?.source, 'https://shop.example/notes', 'the definition\'s own source');
      assert.equal(second?.dataschema, 'urn:mailroom:outbox.noted:v3');
      assert.equal(second?.subject, undefined);
      assert.match(a.id, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/, 'a UUIDv7');
      for (const envelope of target.envelopes) {
        const event = new CloudEvent(JSON.parse(JSON.stringify(envelope)) as never, true);
        assert.equal(event.validate(), true);
      }
    });

    it('bad input gets a clear error naming the problem, and writes nothing', async () => {
      const t = await db.open({ maxPayloadBytes: 1000 });
      const { mailroom } = t;
      const notDefined = { kind: 'event', type: 'outbox.order-placed' };
      const cases: [string, () => Promise<unknown>, RegExp][] = [
        ['undefined event', () => mailroom.publish(undefined as never, {}), /first argument must be an event definition made by defineEvent\(\), got undefined/],
        ['a type name', () => mailroom.publish('outbox.order-placed' as never, {}), /made by defineEvent\(\), got the string "outbox\.order-placed"/],
        ['never defined', () => mailroom.publish({ ...notDefined, version: 'x' } as never, {}), /event "outbox\.order-placed" \(version x\) was not made by defineEvent\(\) in this process/],
        ['invalid payload', () => mailroom.publish(orderPlaced, { orderId: 'o1', total: 'ten' } as never), /event outbox\.order-placed: invalid payload: data\.total/],
        ['oversized payload', () => mailroom.publish(noted, { n: 1, pad: 'x'.repeat(2000) } as never), /over the limit of 1000 bytes \(maxPayloadBytes\)/],
        ['not JSON', () => mailroom.publish(noted, { n: 10n } as never), /not JSON-serialisable.*BigInt/],
        ['empty key', () => mailroom.publish(noted, { n: 1 }, { key: '' }), /key must be a non-empty string of at most 256 characters/],
        ['long key', () => mailroom.publish(noted, { n: 1 }, { key: 'k'.repeat(257) }), /key must be .* at most 256 characters without NUL, got 257 characters/],
        ['numeric key', () => mailroom.publish(noted, { n: 1 }, { key: 42 as never }), /key must be a non-empty string.*got number/],
        ['bad traceparent', () => mailroom.publish(noted, { n: 1 }, { traceparent: 'abc' }), /traceparent must be a W3C trace context/],
        ['bad header name', () => mailroom.publish(noted, { n: 1 }, { headers: { Tenant: 'x' } }), /header name "Tenant" is not a valid CloudEvents extension name/],
        ['reserved header', () => mailroom.publish(noted, { n: 1 }, { headers: { subject: 'x' } }), /header name "subject"/],
        ['header value', () => mailroom.publish(noted, { n: 1 }, { headers: { tenant: 7 as never } }), /headers\.tenant must be a non-empty string/],
        ['bad time', () => mailroom.publish(noted, { n: 1 }, { time: new Date('nope') }), /time must be a valid Date/],
        ['bad item of many', () => mailroom.publishMany(orderPlaced, [{ orderId: 'a', total: 1 }, { orderId: 'b', total: 1.5 }]), /\(item 1\): invalid payload: data\.total/],
        ['many not an array', () => mailroom.publishMany(noted, 'x' as never), /publishMany: data must be an array/],
      ];
      for (const [what, run, message] of cases) await assert.rejects(run, message, what);
      assert.equal(await outboxCount(t), 0);
      assert.deepEqual(await t.sql(`SELECT key FROM "${t.schema}".outbox_keys`), []);
    });

    it('a tx whose transaction already ended is refused with a clear error, and nothing is written', async () => {
      const t = await db.open();
      const { mailroom } = t;
      let leaked: Parameters<Parameters<typeof mailroom.transaction>[0]>[0] | undefined;
      await mailroom.transaction(async (tx) => {
        leaked = tx;
      });
      await assert.rejects(mailroom.publish(noted, { n: 1 }, { tx: leaked! }), (e: unknown) => e instanceof TransactionEndedError && /used after its function returned/.test(e.message));
      const handle = await db.handle();
      if (handle instanceof PGlite) {
        let ended: Parameters<Parameters<PGlite['transaction']>[0]>[0] | undefined;
        await handle.transaction(async (tx) => {
          ended = tx;
        });
        await assert.rejects(mailroom.publish(noted, { n: 2 }, { tx: ended! }), (e: unknown) => e instanceof TransactionEndedError && /already committed or rolled back/.test(e.message));
        // The database itself is not a transaction: each statement would commit on its own.
        await assert.rejects(mailroom.publish(noted, { n: 3 }, { tx: handle }), TransactionEndedError);
      } else {
        const client = await (handle as pg.Pool).connect();
        try {
          await client.query('BEGIN');
          await client.query('COMMIT');
          // After COMMIT the client runs in autocommit: the publish must not commit on its own.
          await assert.rejects(mailroom.publish(noted, { n: 2 }, { tx: client, key: 'k' }), (e: unknown) =>
            e instanceof TransactionEndedError && /tx is not inside a transaction \(its transaction already committed or rolled back\); nothing was written/.test(e.message),
          );
          await assert.rejects(mailroom.publish(noted, { n: 3 }, { tx: handle as pg.Pool }), TransactionEndedError);
        } finally {
          client.release();
        }
      }
      assert.equal(await outboxCount(t), 0);
    });
  });
}
