import type { StandardSchemaV1 } from '@standard-schema/spec';
import { ValidationError } from '../errors.ts';
import { assertEventType, warnIfImperative } from './event-type.ts';
import { registerEvent } from './event-registry.ts';
import { assertSource } from './envelope.ts';

/** Options of {@link defineEvent}. */
export interface EventOptions<TSchema extends StandardSchemaV1 | undefined = undefined> {
  /** Schema version of the payload, a positive integer; from the first event on. A breaking change is a new type. */
  version: number;
  /** Any Standard Schema validator (zod, valibot, arktype); checked at publish. */
  schema?: TSchema;
  /** CloudEvents `source` of this type's events. Default: the mailroom's `source` option. */
  source?: string;
}

/** An event type: its name, schema version and payload schema. Made by {@link defineEvent}. */
export interface EventDefinition<TData = unknown, TInput = TData> {
  readonly kind: 'event';
  readonly type: string;
  readonly version: number;
  readonly schema: StandardSchemaV1<TInput, TData> | undefined;
  readonly source: string | undefined;
}

/** The payload type consumers of an event definition receive. */
export type EventData<D> = D extends EventDefinition<infer T, unknown> ? T : never;
/** The payload type `publish` accepts for an event definition. */
export type EventInput<D> = D extends EventDefinition<unknown, infer I> ? I : never;

/**
 * Defines an event type (a fact, named in the past tense: `order.created`)
 * with its schema version and an optional payload schema, checked at publish.
 * A type that reads as a command (`create.order`, `order.send-email`) gets a
 * warning; an invalid one a ValidationError. Defining the same type and
 * version again with another schema or source is an error.
 *
 * @example
 * export const orderCreated = defineEvent('order.created', { version: 1, schema: z.object({ orderId: z.string() }) });
 */
export function defineEvent<TSchema extends StandardSchemaV1>(
  type: string,
  options: EventOptions<TSchema> & { schema: TSchema },
): EventDefinition<StandardSchemaV1.InferOutput<TSchema>, StandardSchemaV1.InferInput<TSchema>>;
export function defineEvent<TData = unknown>(type: string, options: EventOptions<undefined>): EventDefinition<TData, TData>;
export function defineEvent(type: string, options: EventOptions<StandardSchemaV1 | undefined>): EventDefinition<unknown, unknown> {
  assertEventType(type);
  if (typeof options !== 'object' || options === null) {
    throw new ValidationError(`event ${type}: options with a version are required, e.g. defineEvent('${type}', { version: 1 })`, [
      { path: 'version', message: 'missing' },
    ]);
  }
  const { version, schema, source } = options;
  if (!Number.isSafeInteger(version) || version < 1) {
    throw new ValidationError(`event ${type}: version must be a positive integer, got ${String(version)}`, [{ path: 'version', message: 'invalid' }]);
  }
  if (schema !== undefined && (typeof schema !== 'object' || schema === null || !('~standard' in schema))) {
    throw new TypeError(`event ${type}: schema must be a Standard Schema validator (zod, valibot, arktype, ...)`);
  }
  if (source !== undefined) assertSource(source, `event ${type}: source`);
  warnIfImperative(type);
  const def: EventDefinition<unknown, unknown> = Object.freeze({ kind: 'event' as const, type, version, schema, source });
  return registerEvent(def);
}

/** True when `value` is an event definition made by {@link defineEvent}. */
export function isEventDefinition(value: unknown): value is EventDefinition<unknown, unknown> {
  return typeof value === 'object' && value !== null && (value as { kind?: unknown }).kind === 'event' && typeof (value as { type?: unknown }).type === 'string';
}
