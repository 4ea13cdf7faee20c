import type { Queryable } from '../storage/driver.ts';
import type { FanOutQueries } from './fanout-queries.ts';
import type { RelayedEvent, RelayTarget } from './target.ts';

/** The internal target's name (its cursor in `relay_cursors`). */
export const INTERNAL_TARGET = 'internal';

/**
 * Inserts one job per (event, subscribed consumer group) through `db`;
 * `group` restricts it to one group (a backfill). Returns how many jobs were new.
 */
export async function fanOut(db: Queryable, queries: FanOutQueries, events: readonly RelayedEvent[], group: string | null = null): Promise<number> {
  if (events.length === 0) return 0;
  const { rowCount } = await db.query(queries.fanOut.text, [
    events.map((e) => e.envelope.id),
    events.map((e) => e.envelope.type),
    events.map((e) => e.xid),
    events.map((e) => e.envelope.subject ?? null),
    events.map((e) => e.envelope.correlationid ?? null),
    events.map((e) => JSON.stringify(e.envelope)),
    group,
  ]);
  return rowCount;
}

/**
 * The internal target: fans each batch out into the jobs of the consumer
 * groups, in the relay's transaction, so the jobs and the cursor commit
 * together (no loss, no duplicates).
 */
export function internalTarget(queries: FanOutQueries): RelayTarget {
  return {
    name: INTERNAL_TARGET,
    async publish(events, context) {
      await fanOut(context.tx, queries, events);
    },
  };
}
