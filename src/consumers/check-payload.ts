/**
 * A consumed event's payload checked against its schema before the handler
 * runs: the schema of the definition the handler was typed with
 * (`handleEvent`), else the one this process defined for the event's type and
 * version. A payload that does not match throws a ValidationError, which
 * dead-letters the event with category `validation` (never retried).
 *
 * An event a mailroom published under the same type and version as that
 * definition is not checked again: publish validated it and stored the
 * schema's output, which a schema with transforms would not take as input a
 * second time. So the check covers what publish did not: events of other
 * producers (a broker message) and events of another version (a breaking
 * change published under the same type).
 */
import type { EventDefinition } from '../events/define-event.ts';
import type { ConsumedEvent } from '../events/envelope.ts';
import { findEvent } from '../events/event-registry.ts';
import { validatePayload } from '../payload.ts';

/** Whether a mailroom published the event (its `dataschema` is mailroom's `urn:mailroom:<type>:v<version>`). */
function publishedByMailroom(event: ConsumedEvent): boolean {
  const dataschema = event.envelope.dataschema;
  return typeof dataschema === 'string' && dataschema.startsWith('urn:mailroom:');
}

/**
 * The event with its payload as the schema outputs it, or the event as it came when no check applies.
 *
 * @example
 * const event = await checkedEvent(fromEnvelope(job.data), definitionOfHandler(handler), 'billing');
 */
export async function checkedEvent(event: ConsumedEvent, typed: EventDefinition<unknown, unknown> | undefined, group: string): Promise<ConsumedEvent> {
  const def = typed ?? findEvent(event.type, event.version);
  if (def?.schema === undefined) return event;
  const sameVersion = def.type === event.type && def.version === event.version;
  if (sameVersion && publishedByMailroom(event)) return event; // validated at publish, stored as the schema's output
  const against = sameVersion ? '' : ` against ${def.type} v${def.version}'s schema`;
  const data = await validatePayload(def.schema, event.data, `consumer ${group}: event ${event.id} (${event.type} v${event.version})${against}`);
  return data === event.data ? event : Object.freeze({ ...event, data });
}
