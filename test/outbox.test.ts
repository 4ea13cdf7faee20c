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
import { eventually } from './helpers/events.ts';

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

interface OutboxRow {
  id: string;
  n: number;
  subject: string | null;
  position: string;
  xid: string;
  prev_position: string | null;
  prev_xid: string | null;
}

/** The outbox's rows in position order, with each keyed row's previous row. */
async function outboxRows(t: TestMailroom): Promise<OutboxRow[]> {
  return t.sql<OutboxRow>(
    `SELECT id, (data->>'n')::int AS n, subject, position::text AS position, xid::text AS xid, prev_position::text AS prev_position, prev_xid::text AS prev_xid
       FROM "${t.schema}".outbox ORDER BY position`,
  );
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

    it('a batch with keys records each row\'s previous row: the one before it in the batch, else the key\'s last stored row', async () => {
      const t = await db.open();
      const { mailroom } = t;
      const first = await mailroom.publish(noted, { n: 0 }, { key: 'a' });
      let xid = '';
      const many = await mailroom.transaction(async (tx) => {
        const published = await mailroom.publishMany(noted, [{ n: 1 }, { n: 2 }, { n: 3 }, { n: 4 }, { n: 5 }], { tx, key: (d) => (d.n === 3 ? 'c' : d.n % 2 ? 'a' : 'b') });
        xid = (await tx.query<{ xid: string }>('SELECT pg_current_xact_id()::text AS xid')).rows[0]!.xid;
        return published;
      });
      const rows = await outboxRows(t);
      assert.deepEqual(rows.map((r) => r.id), [first.id, ...many.ids], 'positions in publish order');
      const at = (n: number) => rows.find((r) => r.n === n)!;
      assert.deepEqual(rows.map((r) => [r.n, r.subject]), [[0, 'a'], [1, 'a'], [2, 'b'], [3, 'c'], [4, 'b'], [5, 'a']]);
      assert.deepEqual([at(1).prev_position, at(1).prev_xid], [at(0).position, at(0).xid], 'the first row of a key names its stored row');
      assert.deepEqual([at(2).prev_position, at(2).prev_xid], ['0', '0'], 'a key without rows names none (0)');
      assert.deepEqual([at(3).prev_position, at(3).prev_xid], ['0', '0']);
      assert.deepEqual([at(4).prev_position, at(4).prev_xid], [at(2).position, xid], 'a later row of a key names the one before it in the batch');
      assert.deepEqual([at(5).prev_position, at(5).prev_xid], [at(1).position, xid]);
      assert.deepEqual((await t.sql<{ key: string }>(`SELECT key FROM "${t.schema}".outbox_keys ORDER BY key`)).map((r) => r.key), ['a', 'b', 'c']);
    });

    it(
      'a batch with keys published under REPEATABLE READ records no previous rows (its snapshot may predate the key\'s last commit)',
      { skip: db.name === 'pglite' ? 'a pg client is needed' : false },
      async () => {
        const t = await db.open();
        const { mailroom } = t;
        await mailroom.publish(noted, { n: 0 }, { key: 'a' });
        const client = await ((await db.handle()) as pg.Pool).connect();
        try {
          await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
          await mailroom.publishMany(noted, [{ n: 1 }, { n: 2 }, { n: 3 }], { tx: client, key: (d) => (d.n === 2 ? 'b' : 'a') });
          await client.query('COMMIT');
        } finally {
          await client.query('ROLLBACK').catch(() => {});
          client.release();
        }
        const rows = await outboxRows(t);
        assert.deepEqual(rows.map((r) => [r.n, r.prev_position, r.prev_xid]), [[0, '0', '0'], [1, null, null], [2, null, null], [3, null, null]]);
      },
    );

    it(
      'a batch with keys waits for a key another transaction holds, then names that transaction\'s row; keys are locked in sorted order (no deadlock)',
      { skip: db.name === 'pglite' ? 'PGlite serves one connection: two transactions cannot be open at once' : false },
      async () => {
        const t = await db.open();
        const { mailroom } = t;
        const pool = (await db.handle()) as pg.Pool;
        const [c1, c2] = [await pool.connect(), await pool.connect()];
        const pidOf = async (c: pg.PoolClient) => (await c.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
        const waiting = async (pid: number) =>
          (await t.sql<{ n: number }>(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, [pid]))[0]!.n === 1;
        try {
          const pid2 = await pidOf(c2);
          await c1.query('BEGIN');
          const held = await mailroom.publish(noted, { n: 1 }, { tx: c1, key: 'k-a' }); // T1 holds k-a
          await c2.query('BEGIN');
          // T2's batch has its keys in the other order: k-b, then k-a. Sorted, it waits for k-a and holds nothing.
          const pending = mailroom.publishMany(noted, [{ n: 2 }, { n: 3 }, { n: 4 }], { tx: c2, key: (d) => (d.n === 3 ? 'k-a' : 'k-b') });
          await eventually(() => waiting(pid2), 10_000, 'the batch to wait for the key k-a');
          // Per row in input order, T2 would hold k-b here and T1's next publish would deadlock with it.
          const next = await mailroom.publish(noted, { n: 5 }, { tx: c1, key: 'k-b' });
          await c1.query('COMMIT');
          const batch = await pending;
          await c2.query('COMMIT');
          const rows = await outboxRows(t);
          assert.deepEqual(rows.map((r) => r.id), [held.id, next.id, ...batch.ids], 'the waiting batch takes its positions after the holder committed');
          const at = (n: number) => rows.find((r) => r.n === n)!;
          // Its snapshot is taken after the lock was granted: it sees T1's rows, committed while it waited.
          assert.deepEqual([at(3).prev_position, at(3).prev_xid], [at(1).position, at(1).xid], 'k-a names T1\'s row');
          assert.deepEqual([at(2).prev_position, at(2).prev_xid], [at(5).position, at(5).xid], 'k-b names T1\'s row');
          assert.deepEqual([at(4).prev_position, at(4).prev_xid], [at(2).position, at(2).xid]);
        } finally {
          for (const c of [c1, c2]) {
            await c.query('ROLLBACK').catch(() => {});
            c.release();
          }
        }
      },
    );

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
