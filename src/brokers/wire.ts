/**
 * How events travel on a broker: CloudEvents 1.0 structured JSON in the body,
 * the event id as the broker's message id, and the tracing and correlation
 * attributes also as transport headers so brokers' tools and non-mailroom
 * consumers can route and trace without parsing the body.
 */
import type { CloudEventEnvelope } from '../events/envelope.ts';

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
