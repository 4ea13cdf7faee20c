/**
 * The CloudEvents envelope of an outbox row as JSON text, for the relay and
 * the consumers' backfill: PostgreSQL returns the row's columns as text (the
 * payload as the stored jsonb's own text, the extension attributes as JSON
 * members), and `envelopeText` puts them together, so the envelope is never
 * parsed into objects and serialised again. The same document as
 * `toEnvelope(row)` (test/envelope-sql.test.ts compares them). Building the
 * text in SQL instead cost PostgreSQL about 4.5 µs per event more than
 * returning the columns; the concatenation costs Node about 1.3.
 */
import { RESERVED_ATTRIBUTES } from './envelope.ts';
import type { StoredEventRow } from '../relay/stored-event.ts';

/** The reserved attribute names as an SQL array literal (constants, never user input). */
const RESERVED_SQL = `ARRAY[${[...RESERVED_ATTRIBUTES].map((name) => `'${name}'`).join(', ')}]::text[]`;

/** `time` as RFC 3339 in UTC with milliseconds, as `Date#toISOString()` writes it. */
const timeSql = (o: string) => `to_char(${o}.time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`;

/**
 * The headers as extension attributes, `,"name":"value"` each (reserved names skipped); null when
 * there are none. Most events have no headers (the column is null): the CASE spares them the
 * subquery: the relay's read of 10,000 such rows executed in 11.7-12.7 ms with it, 17.1-19.3 without.
 */
const extensionsSql = (o: string) =>
  `CASE WHEN ${o}.headers IS NOT NULL THEN (SELECT string_agg(',' || to_json(h.key) || ':' || to_json(h.value), '') FROM jsonb_each_text(${o}.headers) AS h WHERE h.key <> ALL (${RESERVED_SQL})) END`;

/** A stored event's attributes, and the parts of its envelope's text (from {@link unpackEventColumns}). */
export interface StoredEventColumns extends Omit<StoredEventRow, 'body'> {
  version: number;
  source: string;
  /** The extension attributes as JSON members, each after a comma; null when there are none. */
  extensions: string | null;
  /** The payload's JSON text. */
  data: string;
}

/** What separates the parts of {@link packedEventColumns}' `packed` column: none of them (digits, a uuid, a timestamp) can hold it. */
const PACK_SEPARATOR = '\x1f';

/** A row of {@link packedEventColumns}: the free-text and nullable columns as they are, the rest packed. */
export interface PackedEventColumns extends Pick<StoredEventColumns, 'type' | 'subject' | 'correlation_id' | 'causation_id' | 'traceparent' | 'source' | 'extensions' | 'data'> {
  /** position, xid, id, time, version, prev_position and prev_xid ('' for none), joined by {@link PACK_SEPARATOR}. */
  packed: string;
}

/**
 * The select list of a stored event for the outbox row aliased `o`: what a
 * target needs without parsing the envelope, and the parts of its text (see
 * {@link storedEventRow}). The seven columns that are digits, a uuid or a
 * timestamp (the key's previous row's position and xid among them) come as one
 * text: node-postgres spends more on each field of a row than on its length,
 * and one column split in Node cost the relay's read about 1.1-1.6 µs less Node
 * CPU per row than seven (1,000-row reads, six alternating pairs;
 * docs/BENCHMARKS.md, session 39). {@link unpackEventColumns} takes it apart.
 *
 * @example
 * `SELECT ${packedEventColumns('o')} FROM outbox AS o`
 */
export function packedEventColumns(o: string): string {
  return `concat_ws(E'\\x1f', ${o}.position, ${o}.xid, ${o}.id, ${timeSql(o)}, ${o}.version,
                    COALESCE(${o}.prev_position::text, ''), COALESCE(${o}.prev_xid::text, '')) AS packed,
          ${o}.type, ${o}.subject, ${o}.correlation_id, ${o}.causation_id, ${o}.traceparent, ${o}.source,
          ${extensionsSql(o)} AS extensions, ${o}.data::text AS data`;
}

/**
 * A row of {@link packedEventColumns} as the columns of a stored event, and the
 * key's previous row (null parts when not recorded).
 *
 * @example
 * const { columns, prevPosition, prevXid } = unpackEventColumns(row);
 */
export function unpackEventColumns(row: PackedEventColumns): { columns: StoredEventColumns; prevPosition: string | null; prevXid: string | null } {
  const [position, xid, id, time, version, prevPosition, prevXid] = row.packed.split(PACK_SEPARATOR) as [string, string, string, string, string, string, string];
  const columns: StoredEventColumns = {
    position,
    xid,
    id,
    type: row.type,
    subject: row.subject,
    correlation_id: row.correlation_id,
    causation_id: row.causation_id,
    traceparent: row.traceparent,
    time,
    version: Number(version),
    source: row.source,
    extensions: row.extensions,
    data: row.data,
  };
  return { columns, prevPosition: prevPosition === '' ? null : prevPosition, prevXid: prevXid === '' ? null : prevXid };
}

/** A type's JSON string, and its `dataschema`'s per version (made by `schemaText`). */
interface QuotedType {
  readonly quoted: string;
  readonly schemas: Map<number, string>;
  readonly schemaText: (version: number) => string;
}

/** The quoted parts of the types and sources seen: few in any outbox. */
const quotedTypes = new Map<string, QuotedType>();
const quotedSources = new Map<string, string>();
/** Past this many entries a map of quoted parts starts over, so that unusual outboxes cannot grow it for good. */
const QUOTED_LIMIT = 1000;

/** `make(key)`, kept in `map` for the next call with the same key. */
function kept<K, V>(map: Map<K, V>, key: K, make: (key: K) => V): V {
  let value = map.get(key);
  if (value === undefined) {
    if (map.size >= QUOTED_LIMIT) map.clear();
    value = make(key);
    map.set(key, value);
  }
  return value;
}

function quotedTypeOf(type: string): QuotedType {
  return { quoted: JSON.stringify(type), schemas: new Map(), schemaText: (version) => JSON.stringify(`urn:mailroom:${type}:v${version}`) };
}

/**
 * The envelope's JSON text from its columns: optional attributes left out
 * when null, extension attributes after them, `data` last. The id is the
 * text of a `uuid` column (hex digits and dashes: nothing to escape); the
 * type, its `dataschema` and the source are quoted once per distinct value
 * (a probe of 1,000 rows: 1.4-1.5 µs an envelope with a `JSON.stringify` for
 * each of the five, 0.28 µs with only the subject's left).
 *
 * @example
 * envelopeText(columns) // '{"specversion":"1.0","id":"0190…","source":"mailroom://shop",…,"data":{"n":1}}'
 */
export function envelopeText(c: StoredEventColumns): string {
  const type = kept(quotedTypes, c.type, quotedTypeOf);
  let text =
    '{"specversion":"1.0","id":"' + c.id + '","source":' + kept(quotedSources, c.source, JSON.stringify) + ',"type":' + type.quoted +
    ',"time":"' + c.time + '","datacontenttype":"application/json","dataschema":' + kept(type.schemas, c.version, type.schemaText);
  if (c.subject !== null) {
    const subject = JSON.stringify(c.subject);
    text += ',"subject":' + subject + ',"partitionkey":' + subject;
  }
  if (c.correlation_id !== null) text += ',"correlationid":' + JSON.stringify(c.correlation_id);
  if (c.causation_id !== null) text += ',"causationid":' + JSON.stringify(c.causation_id);
  if (c.traceparent !== null) text += ',"traceparent":' + JSON.stringify(c.traceparent);
  if (c.extensions !== null) text += c.extensions;
  return text + ',"data":' + c.data + '}';
}

/**
 * A stored event's row from its columns: the attributes, and the envelope's text.
 *
 * @example
 * const events = rows.map((columns) => new StoredEvent(storedEventRow(columns)));
 */
export function storedEventRow(c: StoredEventColumns): StoredEventRow {
  return {
    position: c.position,
    xid: c.xid,
    id: c.id,
    type: c.type,
    subject: c.subject,
    correlation_id: c.correlation_id,
    causation_id: c.causation_id,
    traceparent: c.traceparent,
    time: c.time,
    body: envelopeText(c),
  };
}
