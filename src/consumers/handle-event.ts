import type { EventDefinition } from '../events/define-event.ts';
import type { ConsumedEvent } from '../events/envelope.ts';
import type { JobContext } from '../worker/types.ts';

/** What a consumer's handler gets besides the event. */
export interface ConsumerContext extends JobContext {
  /** The consumer group. */
  readonly group: string;
  /** The job carrying the event in the group's queue (its id is the same on every delivery of this event to this group). */
  readonly job: { readonly id: string; readonly attempt: number; readonly maxAttempts: number };
}

/**
 * A consumer's handler for one event type. Work done through `ctx.tx` commits
 * together with the inbox key and the job's completion. Return to acknowledge;
 * throw to retry (or dead-letter, by the same rules as jobs).
 */
export type EventHandler<TData = unknown> = EventHandlerSignature<TData>['handle'];

// A method signature compares its parameters bivariantly, so a typed handler fits the handlers map.
interface EventHandlerSignature<TData> {
  handle(event: ConsumedEvent<TData>, ctx: ConsumerContext): unknown;
}

const typedBy = new WeakMap<EventHandler<never>, EventDefinition<unknown, unknown>>();

/**
 * Types a consumer's handler by its event definition, so `event.data` has the
 * payload type, and checks each event's payload against the definition's
 * schema before the handler runs: a payload that does not match (another
 * producer's, or a breaking change published under the same type) is
 * dead-lettered with category `validation`, never retried. The handler gets
 * the schema's output (defaults and transforms applied, unknown fields as
 * the schema treats them).
 *
 * @example
 * mailroom.consumer({ group: 'billing', handlers: {
 *   [orderCreated.type]: handleEvent(orderCreated, async (event, ctx) => {
 *     await ctx.tx.query('INSERT INTO invoices (order_id) VALUES ($1)', [event.data.orderId]);
 *   }),
 * } });
 */
export function handleEvent<TData, TInput>(def: EventDefinition<TData, TInput>, handler: EventHandler<TData>): EventHandler<TData> {
  const typed: EventHandler<TData> = (event, ctx) => handler(event, ctx);
  typedBy.set(typed, def as EventDefinition<unknown, unknown>);
  return typed;
}

/** The definition `handleEvent` typed a handler with, if it did. */
export function definitionOfHandler(handler: EventHandler<never>): EventDefinition<unknown, unknown> | undefined {
  return typedBy.get(handler);
}
