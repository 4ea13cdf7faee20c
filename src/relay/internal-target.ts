import { runNamed, type Queryable } from '../storage/driver.ts';
import type { FanOutQueries } from './fanout-queries.ts';
import { storedRowOf } from './stored-event.ts';
import type { RelayedEvent, RelayTarget } from './target.ts';

/** The internal target's name (its cursor in `relay_cursors`). */
export const INTERNAL_TARGET = 'internal';

/**
 * Inserts one job per (event, subscribed consumer group) through `db`, a
 * transaction; `group` restricts it to one group (a backfill). A batch with
 * keyed events first locks their keys in a statement of its own (see
 * `lockKeys`). Returns how many jobs were new.
 */
export async function fanOut(db: Queryable, queries: FanOutQueries, events: readonly RelayedEvent[], group: string | null = null): Promise<number> {
  if (events.length === 0) return 0;
  const rows = events.map(storedRowOf);
  const types = rows.map((r) => r.type);
  const xids = rows.map((r) => r.xid);
  const keys = rows.map((r) => r.subject);
  if (keys.some((key) => key !== null)) await runNamed(db, queries.lockKeys, [types, xids, keys, group]);
  const { rowCount } = await runNamed(db, queries.fanOut, [
    rows.map((r) => r.id),
    types,
    xids,
    keys,
    rows.map((r) => r.correlation_id),
    rows.map((r) => r.body),
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
