/**
 * An outbox event as the relay reads it: the attributes a broker target
 * needs, and the envelope as JSON text (`storedEventRow`). The envelope object is parsed only when something
 * asks for it (a custom target, a `routingKey` function), so the built-in
 * targets send the text as it came.
 */
import type { CloudEventEnvelope } from '../events/envelope.ts';
import type { RelayedEvent } from './target.ts';

/** A stored event's attributes and envelope text (`storedEventRow` of the columns `packedEventColumns` selects). */
export interface StoredEventRow {
  position: string;
  xid: string;
  id: string;
  type: string;
  subject: string | null;
  correlation_id: string | null;
  causation_id: string | null;
  traceparent: string | null;
  /** RFC 3339, UTC, milliseconds. */
  time: string;
  /** The envelope's JSON text. */
  body: string;
}

/** The envelope of a stored event, parsed on first use (shared by every event: no closure per event). */
function parsedEnvelope(this: StoredEvent): CloudEventEnvelope {
  return StoredEvent.envelopeOf(this);
}

/** A relayed event read from the outbox (see the module comment). Frozen; `envelope` is an own enumerable property. */
export class StoredEvent implements RelayedEvent {
  readonly position: string;
  readonly xid: string;
  readonly body: string;
  declare readonly envelope: CloudEventEnvelope;
  readonly #row: StoredEventRow;
  #envelope: CloudEventEnvelope | undefined;

  constructor(row: StoredEventRow) {
    this.position = row.position;
    this.xid = row.xid;
    this.body = row.body;
    this.#row = row;
    Object.defineProperty(this, 'envelope', { get: parsedEnvelope, enumerable: true });
    Object.freeze(this);
  }

  /** The row it was read from, when `event` is a stored event (else undefined: an event made by hand). */
  static rowOf(event: RelayedEvent): StoredEventRow | undefined {
    return event instanceof StoredEvent ? event.#row : undefined;
  }

  /** @internal the envelope getter's body */
  static envelopeOf(event: StoredEvent): CloudEventEnvelope {
    return (event.#envelope ??= JSON.parse(event.body) as CloudEventEnvelope);
  }
}

/**
 * The stored row of any relayed event: its own for an event the relay read,
 * else one made from the envelope of an event made by hand (a custom relay's
 * test, a backfill from an older build).
 *
 * @example
 * const { id, traceparent } = storedRowOf(event);
 */
export function storedRowOf(event: RelayedEvent): StoredEventRow {
  const row = StoredEvent.rowOf(event);
  if (row) return row;
  const e = event.envelope;
  const text = (v: unknown): string | null => (typeof v === 'string' ? v : null);
  return {
    position: event.position,
    xid: event.xid,
    id: e.id,
    type: e.type,
    subject: text(e.subject),
    correlation_id: text(e.correlationid),
    causation_id: text(e.causationid),
    traceparent: text(e.traceparent),
    time: e.time,
    body: event.body ?? JSON.stringify(e),
  };
}
