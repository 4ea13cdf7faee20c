/**
 * The wire contract of events: CloudEvents 1.0, structured JSON mode
 * (docs/EVENTS.md). Built from outbox rows by the relay, parsed back by
 * consumers. Extension attribute names are lower-case letters and digits only.
 */
import { hostname } from 'node:os';
import { ValidationError } from '../errors.ts';

/** A CloudEvents 1.0 event in structured JSON mode, as mailroom writes it. */
export interface CloudEventEnvelope<TData = unknown> {
  specversion: '1.0';
  /** The event id: a UUIDv7, time-ordered, from mailroom (other producers' ids are any string). With `source`, unique per event; the broker message id. */
  id: string;
  source: string;
  type: string;
  /** When it happened (RFC 3339, UTC). */
  time: string;
  datacontenttype: 'application/json';
  /** `urn:mailroom:<type>:v<version>`: the payload's schema version. */
  dataschema: string;
  /** The event's key (aggregate id): also `partitionkey`. */
  subject?: string;
  /** Partitioning extension: the key, for brokers that partition. */
  partitionkey?: string;
  correlationid?: string;
  causationid?: string;
  /** Distributed Tracing extension (W3C trace context). */
  traceparent?: string;
  data: TData;
  /** Further extension attributes: the publisher's `headers`. */
  [extension: string]: unknown;
}

/** An outbox row as the relay reads it. */
export interface OutboxRow {
  position: string;
  xid: string;
  id: string;
  type: string;
  version: number;
  source: string;
  subject: string | null;
  time: Date;
  correlation_id: string | null;
  causation_id: string | null;
  traceparent: string | null;
  headers: Record<string, string> | null;
  data: unknown;
}

/** Attribute names a header may not take: the spec's own and mailroom's extensions. */
export const RESERVED_ATTRIBUTES = new Set([
  'specversion', 'id', 'source', 'type', 'time', 'datacontenttype', 'dataschema', 'subject', 'data', 'data_base64',
  'partitionkey', 'correlationid', 'causationid', 'traceparent', 'tracestate',
]);

const DATASCHEMA = /^urn:mailroom:([a-z][a-z0-9_.-]*):v([1-9][0-9]*)$/;

/**
 * The `dataschema` URI of a type and version.
 *
 * @example
 * dataschemaOf('order.created', 2) // 'urn:mailroom:order.created:v2'
 */
export function dataschemaOf(type: string, version: number): string {
  return `urn:mailroom:${type}:v${version}`;
}

/**
 * The default CloudEvents `source`: `mailroom://<host name>` (lower-cased,
 * characters outside `a-z 0-9 . -` replaced by `-`).
 *
 * @example
 * defaultSource() // 'mailroom://web-1'
 */
export function defaultSource(): string {
  const host = hostname().toLowerCase().replace(/[^a-z0-9.-]/g, '-') || 'localhost';
  return `mailroom://${host}`;
}

/** Validates a CloudEvents `source`: a non-empty URI reference without spaces or control characters, at most 1024 characters. */
export function assertSource(source: unknown, what: string): asserts source is string {
  if (typeof source !== 'string' || source.length === 0 || source.length > 1024 || /[\s\u0000-\u001f\u007f]/.test(source)) {
    throw new ValidationError(`${what} must be a non-empty URI reference without spaces, at most 1024 characters (e.g. 'https://shop.example/orders' or '/orders'), got ${typeof source === 'string' ? JSON.stringify(source) : typeof source}`, [
      { path: 'source', message: 'invalid' },
    ]);
  }
}

/**
 * Builds the CloudEvents envelope of an outbox row. Optional attributes are
 * left out when empty; headers become extension attributes.
 *
 * @example
 * const envelope = toEnvelope(row); JSON.stringify(envelope)
 */
export function toEnvelope(row: OutboxRow): CloudEventEnvelope {
  const envelope: CloudEventEnvelope = {
    specversion: '1.0',
    id: row.id,
    source: row.source,
    type: row.type,
    time: new Date(row.time).toISOString(),
    datacontenttype: 'application/json',
    dataschema: dataschemaOf(row.type, row.version),
    data: row.data,
  };
  if (row.subject !== null) {
    envelope.subject = row.subject;
    envelope.partitionkey = row.subject;
  }
  if (row.correlation_id !== null) envelope.correlationid = row.correlation_id;
  if (row.causation_id !== null) envelope.causationid = row.causation_id;
  if (row.traceparent !== null) envelope.traceparent = row.traceparent;
  for (const [name, value] of Object.entries(row.headers ?? {})) {
    if (!RESERVED_ATTRIBUTES.has(name)) envelope[name] = value;
  }
  return envelope;
}

/** An event as a consumer's handler receives it. */
export interface ConsumedEvent<TData = unknown> {
  readonly id: string;
  readonly type: string;
  /** Schema version of `data` (from mailroom's `dataschema`; 1 for other producers). */
  readonly version: number;
  readonly source: string;
  /** When it happened; null for an event from another producer that left `time` out. */
  readonly time: Date | null;
  /** The event's key (CloudEvents `subject`, else `partitionkey`), or null. */
  readonly key: string | null;
  readonly data: TData;
  readonly correlationId: string | null;
  readonly causationId: string | null;
  readonly traceparent: string | null;
  /** Extension attributes other than mailroom's own (the publisher's headers). */
  readonly headers: Readonly<Record<string, string>>;
  /** The envelope as it travelled. */
  readonly envelope: CloudEventEnvelope<TData>;
}

function invalidEnvelope(reason: string): ValidationError {
  return new ValidationError(`not a mailroom CloudEvents envelope: ${reason}`, [{ path: 'envelope', message: reason }]);
}

const optionalText = (value: unknown, name: string): string | null => {
  if (value === undefined || value === null) return null;
  if (typeof value !== 'string') throw invalidEnvelope(`${name} is not a string`);
  return value;
};

/** The longest event id, source or type accepted from a broker. */
const MAX_ATTRIBUTE_LENGTH = 1024;

const requiredText = (value: unknown, name: string): string => {
  if (typeof value !== 'string' || value.length === 0) throw invalidEnvelope(`${name} is missing or not a string`);
  if (value.length > MAX_ATTRIBUTE_LENGTH) throw invalidEnvelope(`${name} is longer than ${MAX_ATTRIBUTE_LENGTH} characters`);
  return value;
};

/**
 * Reads an envelope back into the event a handler gets. Accepts any
 * CloudEvents 1.0 structured-mode event, not only mailroom's: `id`, `source`
 * and `type` are required; `time` may be absent (then `event.time` is null);
 * a `dataschema` other than mailroom's `urn:mailroom:<type>:v<n>` leaves the
 * version at 1. A payload that is not such an envelope is a ValidationError
 * (the job is dead-lettered as `validation`).
 *
 * @example
 * const event = fromEnvelope(job.data); event.key, event.version
 */
export function fromEnvelope<TData = unknown>(payload: unknown): ConsumedEvent<TData> {
  if (typeof payload !== 'object' || payload === null || Array.isArray(payload)) throw invalidEnvelope('not an object');
  const e = payload as Record<string, unknown>;
  if (e.specversion !== '1.0') throw invalidEnvelope(`specversion is ${JSON.stringify(e.specversion)}, expected "1.0"`);
  const id = requiredText(e.id, 'id');
  const type = requiredText(e.type, 'type');
  const source = requiredText(e.source, 'source');
  let time: Date | null = null;
  if (e.time !== undefined) {
    time = typeof e.time === 'string' ? new Date(e.time) : new Date(Number.NaN);
    if (Number.isNaN(time.getTime())) throw invalidEnvelope('time is not a timestamp');
  }
  let version = 1;
  if (typeof e.dataschema === 'string' && e.dataschema.startsWith('urn:mailroom:')) {
    const schema = DATASCHEMA.exec(e.dataschema);
    if (!schema || schema[1] !== type) throw invalidEnvelope(`dataschema ${JSON.stringify(e.dataschema)} is not urn:mailroom:${type}:v<version>`);
    version = Number(schema[2]);
  } else if (e.dataschema !== undefined && typeof e.dataschema !== 'string') {
    throw invalidEnvelope('dataschema is not a string');
  }
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(e)) {
    if (!RESERVED_ATTRIBUTES.has(name) && typeof value === 'string') headers[name] = value;
  }
  const subject = optionalText(e.subject, 'subject');
  return Object.freeze({
    id,
    type,
    version,
    source,
    time,
    key: subject ?? optionalText(e.partitionkey, 'partitionkey'),
    data: e.data as TData,
    correlationId: optionalText(e.correlationid, 'correlationid'),
    causationId: optionalText(e.causationid, 'causationid'),
    traceparent: optionalText(e.traceparent, 'traceparent'),
    headers: Object.freeze(headers),
    envelope: payload as CloudEventEnvelope<TData>,
  });
}
