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

/** The attributes that also travel as transport headers, in this order. */
export const TRANSPORT_HEADERS = ['traceparent', 'correlationid', 'causationid', 'partitionkey'] as const;

/** A message whose body is still the envelope's text (for a client that writes strings, as ioredis does best). */
export type WireText = Omit<WireMessage, 'body'> & { readonly body: string };

/** A message from its parts; each transport header is set when its value is a string. */
function wireMessage<Body>(id: string, type: string, key: string | null, body: Body, transport: { readonly [name in (typeof TRANSPORT_HEADERS)[number]]?: unknown }) {
  const headers: Record<string, string> = {};
  for (const name of TRANSPORT_HEADERS) {
    const value = transport[name];
    if (typeof value === 'string') headers[name] = value;
  }
  return { id, type, key, body, contentType: CLOUDEVENTS_CONTENT_TYPE, headers };
}

/**
 * Encodes an envelope for a broker.
 *
 * @example
 * const m = toWireMessage(event.envelope); channel.publish(exchange, m.type, m.body, { messageId: m.id, headers: m.headers });
 */
export function toWireMessage(envelope: CloudEventEnvelope): WireMessage {
  return wireMessage(envelope.id, envelope.type, subjectOf(envelope), Buffer.from(JSON.stringify(envelope), 'utf8'), envelope);
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
  return wireOf(event, (text) => Buffer.from(text, 'utf8'));
}

/**
 * `wireMessageOf` with the body left as text: the same message, for a client
 * that encodes strings itself (no Buffer per event).
 *
 * @example
 * const m = wireTextOf(event); redis.xadd(stream, '*', 'id', m.id, 'body', m.body);
 */
export function wireTextOf(event: RelayedEvent): WireText {
  return wireOf(event, (text) => text);
}

function wireOf<Body>(event: RelayedEvent, body: (text: string) => Body) {
  const row = StoredEvent.rowOf(event);
  if (!row) {
    const envelope = event.envelope;
    return wireMessage(envelope.id, envelope.type, subjectOf(envelope), body(event.body ?? JSON.stringify(envelope)), envelope);
  }
  const transport = { traceparent: row.traceparent, correlationid: row.correlation_id, causationid: row.causation_id, partitionkey: row.subject };
  return wireMessage(row.id, row.type, row.subject, body(row.body), transport);
}

function subjectOf(envelope: CloudEventEnvelope): string | null {
  return typeof envelope.subject === 'string' ? envelope.subject : null;
}
