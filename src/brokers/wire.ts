/**
 * How events travel on a broker: CloudEvents 1.0 structured JSON in the body,
 * the event id as the broker's message id, and the tracing and correlation
 * attributes also as transport headers so brokers' tools and non-mailroom
 * consumers can route and trace without parsing the body.
 */
import type { CloudEventEnvelope } from '../events/envelope.ts';
import { StoredEvent } from '../relay/stored-event.ts';
import type { RelayedEvent } from '../relay/target.ts';

/** The content type of a structured-mode CloudEvent. */
export const CLOUDEVENTS_CONTENT_TYPE = 'application/cloudevents+json; charset=utf-8';

/** One event ready for a broker. */
export interface WireMessage {
  /** The event id: the broker's message id / dedup id. */
  readonly id: string;
  readonly type: string;
  /** The event's key, or null. */
  readonly key: string | null;
  /** The structured-mode document, UTF-8. */
  readonly body: Buffer;
  readonly contentType: string;
  /** `traceparent`, `correlationid`, `causationid`, `partitionkey` when the event has them. */
  readonly headers: Readonly<Record<string, string>>;
}

/**
 * Encodes an envelope for a broker.
 *
 * @example
 * const m = toWireMessage(event.envelope); channel.publish(exchange, m.type, m.body, { messageId: m.id, headers: m.headers });
 */
export function toWireMessage(envelope: CloudEventEnvelope): WireMessage {
  const headers: Record<string, string> = {};
  for (const name of ['traceparent', 'correlationid', 'causationid', 'partitionkey'] as const) {
    const value = envelope[name];
    if (typeof value === 'string') headers[name] = value;
  }
  return {
    id: envelope.id,
    type: envelope.type,
    key: typeof envelope.subject === 'string' ? envelope.subject : null,
    body: Buffer.from(JSON.stringify(envelope), 'utf8'),
    contentType: CLOUDEVENTS_CONTENT_TYPE,
    headers,
  };
}

/**
 * Encodes a relayed event for a broker: from its stored row and envelope text
 * when the relay read it (no envelope parsed or serialised), else from its
 * envelope. The same message as `toWireMessage(event.envelope)`.
 *
 * @example
 * const m = wireMessageOf(event); await producer.send(m.id, m.body, m.headers);
 */
export function wireMessageOf(event: RelayedEvent): WireMessage {
  const row = StoredEvent.rowOf(event);
  if (!row) return toWireMessage(event.envelope);
  const headers: Record<string, string> = {};
  if (row.traceparent !== null) headers.traceparent = row.traceparent;
  if (row.correlation_id !== null) headers.correlationid = row.correlation_id;
  if (row.causation_id !== null) headers.causationid = row.causation_id;
  if (row.subject !== null) headers.partitionkey = row.subject;
  return { id: row.id, type: row.type, key: row.subject, body: Buffer.from(row.body, 'utf8'), contentType: CLOUDEVENTS_CONTENT_TYPE, headers };
}
