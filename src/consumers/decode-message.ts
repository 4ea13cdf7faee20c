/**
 * Turns a broker message into what a consumer group stores: the event as a
 * job of the group, or a dead letter (`validation` for a message that is not
 * a CloudEvent, `unknown-type` for an event no handler of the group knows).
 * Accepts structured mode (the body is the whole event, as mailroom's relay
 * and most CloudEvents SDKs send it) and binary mode (`ce-*` / `cloudEvents:*`
 * headers with the data as the body).
 */
import type { SourceMessage } from '../brokers/source.ts';
import type { CloudEventEnvelope } from '../events/envelope.ts';
import { fromEnvelope } from '../events/envelope.ts';
import { derivedId, isUuid } from '../ids.ts';

/** A message that is an event the group handles: stored as a job. */
export interface DecodedEvent {
  readonly kind: 'event';
  readonly jobId: string;
  readonly type: string;
  readonly key: string | null;
  readonly correlationId: string | null;
  /** The W3C trace context the event carried (null: none). */
  readonly traceparent: string | null;
  /** The envelope as JSON text (the job's payload). */
  readonly json: string;
}

/** A message the group cannot handle: stored as a dead letter, never retried. */
export interface DecodedDeadLetter {
  readonly kind: 'dead';
  readonly jobId: string;
  /** The job type shown in the dead-letter queue: the event type, or `mailroom.invalid-message`. */
  readonly type: string;
  readonly category: 'validation' | 'unknown-type';
  readonly message: string;
  readonly correlationId: string | null;
  /** The dead letter's payload as JSON text: the envelope, or the raw message. */
  readonly json: string;
}

export type DecodedMessage = DecodedEvent | DecodedDeadLetter;

/** The job type of dead letters that are not CloudEvents. */
export const INVALID_MESSAGE_TYPE = 'mailroom.invalid-message';

/** How much of an invalid body a dead letter keeps. */
const KEPT_BODY_CHARS = 64 * 1024;

const utf8 = new TextDecoder('utf-8', { fatal: true });
const BINARY_PREFIXES = ['ce-', 'ce_', 'cloudevents:', 'cloudevents_'];

/**
 * The job id of an event in a group: the same for every delivery of the same
 * event (CloudEvents identity is `source` + `id`), so a redelivery is a conflict.
 */
export function ingestJobId(group: string, source: string, id: string): string {
  return derivedId(['ingest', group, source, id], id);
}

/**
 * The inbox key of an event: its id when it is a UUID (mailroom's own events),
 * otherwise a UUID derived from `source` + `id`.
 */
export function inboxKeyOf(event: { readonly id: string; readonly source: string }): string {
  return isUuid(event.id) ? event.id.toLowerCase() : derivedId(['cloudevent', event.source, event.id]);
}

/**
 * Decodes one message for `group`, whose handlers know `types`; bodies over
 * `maxBytes` are dead letters.
 *
 * @example
 * const decoded = decodeMessage(message, 'billing', new Set(['order.created']), 1024 * 1024);
 */
export function decodeMessage(message: SourceMessage, group: string, types: ReadonlySet<string>, maxBytes: number): DecodedMessage {
  const headers = lowerCaseHeaders(message.headers);
  const bytes = typeof message.body === 'string' ? Buffer.byteLength(message.body) : message.body.byteLength;
  if (bytes > maxBytes) {
    return invalid(message, group, headers, `the message is ${bytes} bytes, over the consumer's maxMessageBytes (${maxBytes})`);
  }
  let text: string;
  try {
    text = typeof message.body === 'string' ? message.body : utf8.decode(message.body);
  } catch {
    return invalid(message, group, headers, 'the body is not valid UTF-8');
  }
  let envelope: unknown;
  try {
    envelope = binaryAttributes(headers) ? fromBinaryMode(text, headers) : JSON.parse(text);
  } catch (error) {
    return invalid(message, group, headers, `the body is not JSON: ${error instanceof Error ? error.message : String(error)}`);
  }
  let event;
  try {
    event = fromEnvelope(envelope);
  } catch (error) {
    return invalid(message, group, headers, error instanceof Error ? error.message : String(error));
  }
  const json = JSON.stringify(event.envelope);
  if (json.includes('\\u0000')) return invalid(message, group, headers, 'the event contains a NUL character (\\u0000), which PostgreSQL cannot store in JSON');
  const jobId = ingestJobId(group, event.source, event.id);
  if (!types.has(event.type)) {
    return {
      kind: 'dead',
      jobId,
      type: event.type,
      category: 'unknown-type',
      message: `consumer group ${group} has no handler for event type ${event.type} (it handles ${[...types].join(', ')}); it arrived from ${message.origin}`,
      correlationId: event.correlationId,
      json,
    };
  }
  return { kind: 'event', jobId, type: event.type, key: event.key, correlationId: event.correlationId, traceparent: event.traceparent, json };
}

function lowerCaseHeaders(headers: Readonly<Record<string, string>> | undefined): Record<string, string> {
  const result: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers ?? {})) if (typeof value === 'string') result[name.toLowerCase()] = value;
  return result;
}

/** The binary-mode attributes among the headers (`ce-id` → `id`), or null when the message is not in binary mode. */
function binaryAttributes(headers: Record<string, string>): Record<string, string> | null {
  const contentType = headers['content-type'] ?? '';
  if (contentType.startsWith('application/cloudevents')) return null; // structured mode
  const attributes: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    const prefix = BINARY_PREFIXES.find((p) => name.startsWith(p));
    if (prefix !== undefined) attributes[name.slice(prefix.length)] = value;
  }
  return attributes.specversion === undefined ? null : attributes;
}

function fromBinaryMode(body: string, headers: Record<string, string>): CloudEventEnvelope | Record<string, unknown> {
  const attributes = binaryAttributes(headers)!;
  const contentType = headers['content-type'] ?? attributes.datacontenttype ?? 'application/json';
  const isJson = /^application\/([a-z0-9.+-]*\+)?json\b/i.test(contentType) || contentType.startsWith('text/json');
  return { ...attributes, datacontenttype: contentType, data: isJson && body.length > 0 ? (JSON.parse(body) as unknown) : body };
}

function invalid(message: SourceMessage, group: string, headers: Record<string, string>, reason: string): DecodedDeadLetter {
  const body = typeof message.body === 'string' ? Buffer.from(message.body) : Buffer.from(message.body.buffer, message.body.byteOffset, message.body.byteLength);
  const messageId = typeof message.messageId === 'string' && message.messageId.length > 0 ? message.messageId : null;
  const identity = messageId ?? `sha256:${derivedId([body.toString('base64')])}`;
  let kept: { body: string; encoding: 'utf8' | 'base64'; truncated: boolean };
  const asText = body.toString('utf8');
  const printable = !asText.includes('\uFFFD') && !asText.includes('\u0000');
  if (printable) kept = { body: asText.slice(0, KEPT_BODY_CHARS), encoding: 'utf8', truncated: asText.length > KEPT_BODY_CHARS };
  else {
    const b64 = body.subarray(0, (KEPT_BODY_CHARS / 4) * 3).toString('base64');
    kept = { body: b64, encoding: 'base64', truncated: body.byteLength > (KEPT_BODY_CHARS / 4) * 3 };
  }
  const cleanHeaders: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) cleanHeaders[name.replace(/\u0000/g, '')] = value.replace(/\u0000/g, '');
  return {
    kind: 'dead',
    jobId: derivedId(['invalid', group, identity]),
    type: INVALID_MESSAGE_TYPE,
    category: 'validation',
    message: `not a CloudEvent (${reason}); from ${message.origin}`,
    correlationId: null,
    json: JSON.stringify({ origin: message.origin, messageId, headers: cleanHeaders, bytes: body.byteLength, ...kept }),
  };
}
