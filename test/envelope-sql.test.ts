/**
 * The envelope text the relay builds from the columns PostgreSQL returns
 * (src/events/envelope-sql.ts) is the document `toEnvelope` builds from the same outbox row, and a stored
 * event gives targets the same message as one made from its envelope.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { defineEvent, toEnvelope, toWireMessage } from '../src/index.ts';
import { packedEventColumns, storedEventRow, unpackEventColumns, type PackedEventColumns, type StoredEventColumns } from '../src/events/envelope-sql.ts';
import type { OutboxRow } from '../src/events/envelope.ts';
import { wireMessageOf, wireTextOf } from '../src/brokers/wire.ts';
import { StoredEvent, storedRowOf, type StoredEventRow } from '../src/relay/stored-event.ts';
import { testDatabases, type TestMailroom } from './helpers/databases.ts';

const noted = defineEvent<unknown>('envelope.noted', { version: 3 });

/** Text PostgreSQL stores as is: no NUL, no lone surrogate (publish refuses both). */
const text = (max: number) =>
  fc.string({ unit: 'binary', maxLength: max }).filter((s) => !s.includes('\u0000') && !/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s));
const payload = fc.jsonValue({ maxDepth: 3 }).map((v) => JSON.parse(JSON.stringify(v)) as unknown).filter((v) => !JSON.stringify(v).includes('\\u0000'));
const options = fc.record(
  {
    key: text(40).filter((s) => s.length > 0),
    correlationId: text(40).filter((s) => s.length > 0),
    causationId: text(40).filter((s) => s.length > 0),
    headers: fc.dictionary(fc.stringMatching(/^[a-z0-9]{1,20}$/).filter((k) => !['id', 'type', 'data', 'time', 'source', 'subject'].includes(k)), text(60).filter((s) => s.length > 0), { maxKeys: 4 }),
    traceparent: fc.constant('00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'),
    time: fc.date({ min: new Date('1970-01-01T00:00:00Z'), max: new Date('9999-12-31T23:59:59.999Z'), noInvalidDate: true }),
  },
  { requiredKeys: [] },
);

/**
 * Each event of the outbox, as the relay reads it and as `toEnvelope` reads it. The relay's packed
 * read, taken apart, must give each column as the row holds it, and the key's previous row.
 */
async function readBoth(t: TestMailroom): Promise<{ stored: StoredEventRow; row: OutboxRow }[]> {
  const packed = await t.sql<PackedEventColumns>(`SELECT ${packedEventColumns('o')} FROM "${t.schema}".outbox AS o ORDER BY o.position`);
  const rows = await t.sql<OutboxRow & { prev_position: string | null; prev_xid: string | null }>(
    `SELECT position::text AS position, xid::text AS xid, id, type, version, source, subject, time, correlation_id, causation_id, traceparent, headers, data,
            prev_position::text AS prev_position, prev_xid::text AS prev_xid
       FROM "${t.schema}".outbox ORDER BY position`,
  );
  assert.equal(packed.length, rows.length);
  return rows.map(({ prev_position, prev_xid, ...row }, i) => {
    const { columns, prevPosition, prevXid } = unpackEventColumns(packed[i]!);
    const { time: _time, extensions: _extensions, data: _data, ...attributes } = columns;
    const expected = { position: row.position, xid: row.xid, id: row.id, type: row.type, subject: row.subject, correlation_id: row.correlation_id, causation_id: row.causation_id, traceparent: row.traceparent, version: row.version, source: row.source };
    // time, the extensions and data are checked through the envelope (assertSame).
    assert.deepEqual(attributes, expected, `the packed read of event ${i}: ${JSON.stringify(packed[i]!.packed)}`);
    assert.deepEqual([prevPosition, prevXid], [prev_position, prev_xid], `its key's previous row: ${JSON.stringify(packed[i]!.packed)}`);
    return { stored: storedEventRow(columns), row };
  });
}

function assertSame(stored: StoredEventRow, row: OutboxRow): void {
  const envelope = toEnvelope(row);
  assert.deepEqual(JSON.parse(stored.body), envelope, `body of event ${row.id}: ${stored.body}`);
  assert.equal(stored.id, envelope.id);
  assert.equal(stored.type, envelope.type);
  assert.equal(stored.subject, envelope.subject ?? null);
  assert.equal(stored.correlation_id, envelope.correlationid ?? null);
  assert.equal(stored.causation_id, envelope.causationid ?? null);
  assert.equal(stored.traceparent, envelope.traceparent ?? null);
  assert.equal(stored.time, envelope.time);
  const event = new StoredEvent(stored);
  const fromStored = wireMessageOf(event);
  const fromEnvelope = toWireMessage(envelope);
  assert.deepEqual({ ...fromStored, body: JSON.parse(fromStored.body.toString('utf8')) }, { ...fromEnvelope, body: JSON.parse(fromEnvelope.body.toString('utf8')) });
  assert.deepEqual(wireTextOf(event), { ...fromStored, body: stored.body }, 'the text form is the same message, its body the stored text');
}

for (const db of testDatabases()) {
  describe(`the envelope built from its columns (${db.name})`, () => {
    it('is the document toEnvelope builds, for any payload and options publish takes', async () => {
      const t = await db.open();
      await fc.assert(
        fc.asyncProperty(payload, options, async (data, o) => {
          await t.sql(`DELETE FROM "${t.schema}".outbox`);
          await t.mailroom.publish(noted, data, o);
          const [both] = await readBoth(t);
          assertSame(both!.stored, both!.row);
        }),
        { numRuns: db.name === 'pglite' ? 60 : 120 },
      );
    });

    it('skips reserved header names, keeps microseconds out of time, and keeps data written by older builds', async () => {
      const t = await db.open();
      await t.mailroom.publish(noted, { big: 1, text: 'a"b\\c\n\u001f' }, { key: 'k' });
      await t.mailroom.publish(noted, [1.5, -0, 1e300, 'é😀'], {});
      await t.mailroom.publish(noted, { again: true }, { key: 'k' }); // names the first as its key's previous row
      const [{ named }] = (await t.sql<{ named: number }>(`SELECT count(*)::int AS named FROM "${t.schema}".outbox WHERE prev_position IS NOT NULL AND prev_xid IS NOT NULL`)) as [{ named: number }];
      assert.ok(named >= 1, 'an event names its key\'s previous row');
      // Headers as an older build (or a hand-written row) could have left them, and a time with microseconds.
      await t.sql(`UPDATE "${t.schema}".outbox SET headers = '{"id":"not-the-id","source":"x","data":"y","zeta":"z","a1":"b"}', time = '2026-01-02 03:04:05.999999+00'`);
      for (const { stored, row } of await readBoth(t)) {
        assertSame(stored, row);
        const body = JSON.parse(stored.body) as Record<string, unknown>;
        assert.equal(body.id, row.id);
        assert.equal(body.zeta, 'z');
        assert.equal(body.time, '2026-01-02T03:04:05.999Z', 'milliseconds, cut as Date#toISOString cuts them');
      }
    });
  });
}

describe('a stored event', () => {
  const row: StoredEventRow = {
    position: '7', xid: '9', id: '01936f8e-1f2a-7000-8000-000000000001', type: 'a.b', subject: 'k1', correlation_id: 'c1', causation_id: null, traceparent: null,
    time: '2026-01-02T03:04:05.678Z',
    body: '{"specversion":"1.0","id":"01936f8e-1f2a-7000-8000-000000000001","type":"a.b","subject":"k1","data":{"n": 1}}',
  };

  it('parses its envelope once, on first use, and shows it as an own property (spread, JSON)', () => {
    const event = new StoredEvent(row);
    assert.ok(Object.isFrozen(event));
    const first = event.envelope;
    assert.equal(event.envelope, first, 'parsed once');
    assert.deepEqual(first.data, { n: 1 });
    assert.deepEqual(Object.keys(event), ['position', 'xid', 'body', 'envelope']);
    assert.deepEqual({ ...event }.envelope, first);
    assert.deepEqual(JSON.parse(JSON.stringify(event)).envelope, first);
    assert.equal(storedRowOf(event), row);
  });

  it('of an event made by hand is read from its envelope', () => {
    const envelope = JSON.parse(row.body) as ReturnType<typeof toEnvelope>;
    const byHand = { position: '7', xid: '9', envelope: { ...envelope, time: row.time, correlationid: 'c1' } };
    const made = storedRowOf(byHand);
    assert.equal(made.id, row.id);
    assert.equal(made.subject, 'k1');
    assert.equal(made.correlation_id, 'c1');
    assert.equal(made.causation_id, null);
    assert.deepEqual(JSON.parse(made.body), byHand.envelope);
    assert.deepEqual(wireMessageOf(byHand), toWireMessage(byHand.envelope));
    const text = wireTextOf(byHand);
    assert.deepEqual({ ...text, body: Buffer.from(text.body, 'utf8') }, toWireMessage(byHand.envelope));
  });
});

describe('the envelope text of many types, versions and sources', () => {
  /** The text as built before the quoted parts were kept: every part through JSON.stringify. */
  const reference = (c: StoredEventColumns): string =>
    '{"specversion":"1.0","id":' + JSON.stringify(c.id) + ',"source":' + JSON.stringify(c.source) + ',"type":' + JSON.stringify(c.type) +
    ',"time":"' + c.time + '","datacontenttype":"application/json","dataschema":' + JSON.stringify(`urn:mailroom:${c.type}:v${c.version}`) +
    (c.subject === null ? '' : ',"subject":' + JSON.stringify(c.subject) + ',"partitionkey":' + JSON.stringify(c.subject)) +
    ',"data":' + c.data + '}';
  const columns = (i: number, type: string, version: number, source: string): StoredEventColumns => ({
    position: String(i), xid: '5', id: `01936f8e-1f2a-7000-8000-${String(i).padStart(12, '0')}`, type, subject: i % 3 === 0 ? null : `k"${i}`,
    correlation_id: null, causation_id: null, traceparent: null, time: '2026-01-02T03:04:05.678Z', version, source, extensions: null, data: `{"i":${i}}`,
  });

  it('is the same text whichever type, version or source came before, past the limit of kept parts', () => {
    const sources = ['mailroom://shop', 'mailroom://a"b\\c', 'mailroom://é😀\u001f', 'mailroom://shop'];
    // 2,500 events: 1,200 distinct sources and types (past the 1,000 kept, so the caches start over), interleaved with repeats.
    for (let i = 0; i < 2500; i++) {
      const type = i % 2 === 0 ? `order.t${i % 1200}` : 'order.created';
      const source = i % 5 === 0 ? `mailroom://s${i % 1200}` : sources[i % sources.length]!;
      const c = columns(i, type, 1 + ((i * 7) % 3), source); // each type in several versions, version 1 among them
      const text = storedEventRow(c).body;
      assert.equal(text, reference(c), `event ${i}`);
      assert.equal((JSON.parse(text) as { source: string }).source, source);
    }
  });
});
