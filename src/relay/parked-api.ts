/**
 * `mailroom.parkedEvents`: the events relay targets refused for good
 * (docs/EVENTS.md, "Events a target refuses"), as a work surface: list them,
 * publish them again once the cause is fixed, or discard them.
 */
import type { CloudEventEnvelope } from '../events/envelope.ts';
import { MailroomError, ValidationError } from '../errors.ts';
import type { Driver } from '../storage/driver.ts';
import type { ParkedEvent } from './parking.ts';
import type { ParkedQueries } from './parked-queries.ts';
import { RefusedEventError } from './refused.ts';
import type { RelayedEvent, RelayTarget } from './target.ts';

/** A parked event as `relay_parked` records it. */
export interface ParkedEventRecord extends ParkedEvent {
  /** The relay that parked it. */
  parkedBy: string;
  parkedAt: Date;
  /** The size of the envelope as it was sent, in bytes. */
  bytes: number;
}

/** What `republish` did: the events the target took (no longer parked) and the ones it refused again (still parked). */
export interface RepublishResult {
  republished: string[];
  refused: { eventId: string; reason: string }[];
}

/** Read, republish and discard parked events. */
export interface ParkedEventsApi {
  /**
   * Parked events, oldest first per target (at most `limit`, default 100).
   *
   * @example
   * const parked = await mailroom.parkedEvents.list({ target: 'nats:orders' });
   */
  list(options?: { target?: string; limit?: number }): Promise<ParkedEventRecord[]>;
  /**
   * Publishes the target's parked events again (all, or those in `eventIds`),
   * one at a time in outbox order, each exactly as it was first sent; an event
   * the target takes is no longer parked, one it refuses again stays parked
   * with the new reason. Any other failure stops the call (the events not yet
   * published stay parked; run it again). Pass the same target the relay
   * uses (its `name` picks the parked rows); the caller closes it.
   *
   * @example
   * const target = nats({ url, stream: 'orders' }); // after raising the stream's max_msg_size
   * const { republished, refused } = await mailroom.parkedEvents.republish(target);
   * await target.close?.();
   */
  republish(target: RelayTarget, options?: { eventIds?: readonly string[] }): Promise<RepublishResult>;
  /**
   * Deletes parked events of a target without publishing them: the ids given,
   * or every one with `{ all: true }`. Resolves with the ids deleted.
   *
   * @example
   * await mailroom.parkedEvents.discard('nats:orders', { eventIds: ['01J…'] });
   */
  discard(target: string, which: { eventIds: readonly string[] } | { all: true }): Promise<{ discarded: string[] }>;
}

interface Deps {
  driver: Driver;
  queries: ParkedQueries;
  fail: (error: unknown) => never;
}

/** Builds `mailroom.parkedEvents` on a driver and the schema's statements. */
export function parkedEventsApi(deps: Deps): ParkedEventsApi {
  return {
    list: (options) => listParked(deps, options ?? {}).catch(deps.fail),
    republish: (target, options) => republishParked(deps, target, options ?? {}).catch(deps.fail),
    discard: (target, which) => discardParked(deps, target, which).catch(deps.fail),
  };
}

async function listParked({ driver, queries }: Deps, options: { target?: string; limit?: number }): Promise<ParkedEventRecord[]> {
  const target = options.target === undefined ? null : targetName(options.target, 'list');
  const limit = options.limit ?? 100;
  if (!Number.isInteger(limit) || limit < 1 || limit > 10_000) {
    throw new ValidationError(`parkedEvents.list: limit must be an integer from 1 to 10000, got ${String(limit)}`, [{ path: 'limit', message: 'invalid' }]);
  }
  const { rows } = await driver.run<{ target: string; position: string; event_id: string; type: string; reason: string; holder: string; parked_at: Date | string; bytes: number }>(
    queries.list,
    [target, limit],
  );
  return rows.map((r) => ({
    target: r.target,
    position: r.position,
    eventId: r.event_id,
    type: r.type,
    reason: r.reason,
    parkedBy: r.holder,
    parkedAt: new Date(r.parked_at),
    bytes: Number(r.bytes),
  }));
}

async function republishParked({ driver, queries }: Deps, target: RelayTarget, options: { eventIds?: readonly string[] }): Promise<RepublishResult> {
  if (typeof target !== 'object' || target === null || typeof target.publish !== 'function') {
    throw new ValidationError('parkedEvents.republish: target must be a relay target (an object with name and publish), as passed to relay({ to })', [
      { path: 'target', message: 'invalid' },
    ]);
  }
  const name = targetName(target.name, 'republish');
  const ids = options.eventIds === undefined ? null : eventIds(options.eventIds, 'republish');
  const result: RepublishResult = { republished: [], refused: [] };
  let after = '-1';
  for (;;) {
    const { rows } = await driver.run<{ position: string; xid: string; event_id: string; body: string }>(queries.next, [name, ids, after]);
    const row = rows[0];
    if (!row) return result;
    after = row.position;
    const event: RelayedEvent = { position: row.position, xid: row.xid, body: row.body, envelope: JSON.parse(row.body) as CloudEventEnvelope };
    try {
      // The row goes in the transaction the target publishes in: for a target that writes to this database they commit together.
      await driver.transaction(async (tx) => {
        await target.publish([event], { tx });
        await tx.run(queries.remove, [name, row.position]);
      });
      result.republished.push(row.event_id);
    } catch (error) {
      if (error instanceof RefusedEventError && error.eventId === row.event_id) {
        await driver.run(queries.refusedAgain, [name, row.position, error.reason]);
        result.refused.push({ eventId: row.event_id, reason: error.reason });
        continue;
      }
      const reason = error instanceof Error ? error.message : String(error);
      throw new MailroomError(
        `parkedEvents.republish: publishing parked event ${row.event_id} to ${name} failed: ${reason}; ` +
          `${result.republished.length} were republished before it, it and the rest stay parked (run it again once the target is reachable)`,
        { cause: error },
      );
    }
  }
}

async function discardParked({ driver, queries }: Deps, target: string, which: { eventIds: readonly string[] } | { all: true }): Promise<{ discarded: string[] }> {
  const name = targetName(target, 'discard');
  const chosen = which as { eventIds?: readonly string[]; all?: unknown } | undefined;
  let ids: string[] | null;
  if (chosen?.eventIds !== undefined) ids = eventIds(chosen.eventIds, 'discard');
  else if (chosen?.all === true) ids = null;
  else {
    throw new ValidationError(`parkedEvents.discard: say which parked events of ${name} to delete: { eventIds: [...] }, or { all: true } for every one`, [
      { path: 'eventIds', message: 'missing' },
    ]);
  }
  const { rows } = await driver.run<{ event_id: string }>(queries.discard, [name, ids]);
  return { discarded: rows.map((r) => r.event_id) };
}

function targetName(value: unknown, call: string): string {
  if (typeof value !== 'string' || value.length === 0 || value.length > 128) {
    throw new ValidationError(`parkedEvents.${call}: the target must be a relay target's name (1-128 characters, e.g. 'nats:orders'), got ${JSON.stringify(value) ?? String(value)}`, [
      { path: 'target', message: 'invalid' },
    ]);
  }
  return value;
}

function eventIds(value: unknown, call: string): string[] {
  if (!Array.isArray(value) || value.length === 0 || value.some((id) => typeof id !== 'string' || id.length === 0)) {
    throw new ValidationError(`parkedEvents.${call}: eventIds must be a non-empty array of event ids (strings), got ${JSON.stringify(value) ?? String(value)}`, [
      { path: 'eventIds', message: 'invalid' },
    ]);
  }
  return value as string[];
}
