import { TransactionEndedError, ValidationError } from '../errors.ts';
import { newId } from '../ids.ts';
import { serializePayload, validatePayload } from '../payload.ts';
import { asQueryable, type Driver, type TransactionLike } from '../storage/driver.ts';
import { checkSignal } from '../signal-option.ts';
import { currentContext } from '../observe/context.ts';
import { inProducerSpan } from '../observe/tracing.ts';
import { isEventDefinition, type EventDefinition } from './define-event.ts';
import { isRegisteredEvent } from './event-registry.ts';
import type { OutboxQueries } from './outbox-queries.ts';
import { checkKey, checkPublishOptions, type CheckedPublishOptions, type PublishManyOptions } from './publish-options.ts';

/** What publishing needs from its mailroom. */
export interface PublishDeps {
  driver: Driver;
  queries: OutboxQueries;
  maxPayloadBytes: number;
  /** The mailroom's CloudEvents source, for definitions without their own. */
  source: string;
}


function keyOf<TInput>(option: PublishManyOptions<TInput>['key'], data: TInput, index: number, count: number): string | null {
  if (option === undefined) return null;
  const value: unknown = typeof option === 'function' ? option(data, index) : option;
  return checkKey(value, count > 1 && typeof option === 'function' ? `key (item ${index})` : 'key');
}

/**
 * Validates events of one type and writes them to the outbox in one
 * statement, in the caller's transaction when `tx` is given; returns their
 * ids in input order. Everything is checked before anything is written.
 */
export async function publishEvents<TData, TInput>(
  deps: PublishDeps,
  def: EventDefinition<TData, TInput>,
  items: readonly TInput[],
  options: PublishManyOptions<TInput>,
): Promise<string[]> {
  if (!isEventDefinition(def)) {
    throw new TypeError(
      `publish: the first argument must be an event definition made by defineEvent(), got ${def === undefined ? 'undefined' : typeof def === 'string' ? `the string ${JSON.stringify(def)}` : typeof def}`,
    );
  }
  if (!isRegisteredEvent(def)) {
    throw new TypeError(`publish: event ${JSON.stringify(def.type)} (version ${String(def.version)}) was not made by defineEvent() in this process; define it with defineEvent() and publish that definition`);
  }
  const what = `event ${def.type}`;
  const shared = withContextDefaults(checkPublishOptions(options));
  const inTx = options.tx !== undefined && options.tx !== null;
  const signal = checkSignal(options.signal, `publish ${def.type}`, inTx);
  const ids: string[] = [];
  const keys: (string | null)[] = [];
  const payloads: string[] = [];
  for (let i = 0; i < items.length; i++) {
    const itemWhat = items.length > 1 ? `${what} (item ${i})` : what;
    const value = await validatePayload(def.schema, items[i], itemWhat);
    payloads.push(serializePayload(value, deps.maxPayloadBytes, itemWhat));
    keys.push(keyOf(options.key, items[i] as TInput, i, items.length));
    ids.push(newId());
  }
  if (ids.length === 0) return [];
  const params: unknown[] = [
    ids,
    def.type,
    def.version,
    def.source ?? deps.source,
    shared.time,
    shared.correlationId,
    shared.causationId,
    shared.traceparent,
    shared.headers,
    keys,
    payloads,
  ];
  const attributes = { 'messaging.system': 'mailroom', 'messaging.destination.name': def.type, 'messaging.batch.message_count': ids.length };
  return inProducerSpan(`publish ${def.type}`, attributes, (traceparent) => {
    // An explicit traceparent wins; else the publish span's (or the caller's).
    params[7] = shared.traceparent ?? traceparent;
    // Only undefined and null mean "no transaction": a falsy value such as 0 or '' is refused, not ignored.
    // A batch with keys locks them and records each row's previous row in one call (migration 20); a
    // single keyed event costs less through the trigger (one row: no set to work on).
    const keyed = ids.length > 1 && keys.some((k) => k !== null);
    return inTx ? insertInTransaction(deps, def, params, keyed, ids.length, options.tx!) : insertOnPool(deps, params, keyed, signal);
  });
}

/**
 * Fills what the options leave out from the work in progress: inside a handler
 * (or `withCorrelation`), the request's correlation id, and as causation id the
 * event (or else the job) being handled.
 */
function withContextDefaults(shared: CheckedPublishOptions): CheckedPublishOptions {
  const context = currentContext();
  if (!context) return shared;
  return {
    ...shared,
    correlationId: shared.correlationId ?? context.correlationId,
    causationId: shared.causationId ?? context.eventId ?? context.jobId ?? null,
  };
}

async function insertOnPool(deps: PublishDeps, params: unknown[], keyed: boolean, signal: AbortSignal | undefined): Promise<string[]> {
  const options = signal ? { signal } : {};
  const { rows } = keyed
    ? await deps.driver.run<{ id: string }>(deps.queries.insertKeyed, [...params, null], options)
    : await deps.driver.run<{ id: string }>(deps.queries.insert, params, options);
  return rows.map((r) => r.id);
}

async function insertInTransaction(deps: PublishDeps, def: { type: string }, params: unknown[], keyed: boolean, count: number, txOption: TransactionLike): Promise<string[]> {
  const ended = () =>
    new TransactionEndedError(
      `publish ${def.type}: tx is not inside a transaction (its transaction already committed or rolled back); nothing was written. Publish inside the transaction: before COMMIT, or within mailroom.transaction(fn)`,
    );
  const tx = asQueryable(txOption);
  const xid = await tx.query<{ xid: string }>(deps.queries.currentXid.text).catch((error: unknown) => {
    // PGlite's transaction object refuses on its own once the transaction is over.
    throw error instanceof Error && /transaction is closed/i.test(error.message) ? ended() : error;
  });
  // In autocommit (a client whose transaction ended), each statement is a transaction with its own xid.
  const statement = keyed ? deps.queries.insertKeyed : deps.queries.insertInTransaction;
  const { rows } = await tx.query<{ id: string }>(statement.text, [...params, xid.rows[0]!.xid]);
  if (rows.length !== count) throw ended();
  return rows.map((r) => r.id);
}

/** Validates the items argument of publishMany. */
export function checkItems(data: unknown): asserts data is readonly unknown[] {
  if (!Array.isArray(data)) throw new ValidationError('publishMany: data must be an array', [{ path: 'data', message: 'not an array' }]);
}
