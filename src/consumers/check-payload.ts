/**
 * A consumed event's payload checked against its schema before the handler
 * runs: the schema of the definition the handler was typed with
 * (`handleEvent`), else the one this process defined for the event's type and
 * version. A payload that does not match throws a ValidationError, which
 * dead-letters the event with category `validation` (never retried).
 */
import type { EventDefinition } from '../events/define-event.ts';
import type { ConsumedEvent } from '../events/envelope.ts';
import { findEvent } from '../events/event-registry.ts';
import { validatePayload } from '../payload.ts';

/**
 * The event with its payload as the schema outputs it, or the event as it came when no schema applies.
 *
 * @example
 * const event = await checkedEvent(fromEnvelope(job.data), definitionOfHandler(handler), 'billing');
 */
export async function checkedEvent(event: ConsumedEvent, typed: EventDefinition<unknown, unknown> | undefined, group: string): Promise<ConsumedEvent> {
  const def = typed ?? findEvent(event.type, event.version);
  if (def?.schema === undefined) return event;
  const against = def.type === event.type && def.version === event.version ? '' : ` against ${def.type} v${def.version}'s schema`;
  const data = await validatePayload(def.schema, event.data, `consumer ${group}: event ${event.id} (${event.type} v${event.version})${against}`);
  return data === event.data ? event : Object.freeze({ ...event, data });
}
