import type { ConsumerQueries } from '../consumers/consumer-queries.ts';
import { findHolder, type HeldBackBy } from '../relay/held-back.ts';
import { INTERNAL_TARGET } from '../relay/internal-target.ts';
import type { RelayQueries } from '../relay/relay-queries.ts';
import type { Driver } from '../storage/driver.ts';
import { runReport } from '../storage/report-query.ts';

/** Health numbers of one relay target. */
export interface RelayTargetStats {
  /** Committed events its cursor has not passed yet. */
  unpublished: number;
  /** Age of the oldest of them, in seconds (0 when none). */
  lagSeconds: number;
  /** The open transaction that keeps committed events from being delivered, or null. */
  heldBackBy: HeldBackBy | null;
  /** The relay holding the target's lease, or null. */
  holder: string | null;
  /** Events the target refused for good, parked in `relay_parked` (see `relay({ onRefused })`). */
  parked: number;
}

/** Health numbers of one consumer group. */
export interface ConsumerGroupStats {
  /** Where its events come from: null for internal events, else the broker source (e.g. `rabbitmq billing`). */
  source: string | null;
  /** Events not yet handled: `unrelayed` + `unfinished`. */
  lag: number;
  /** Events of its types the fan-out has not reached yet (0 for a group reading from a broker: what waits there is the broker's to report). */
  unrelayed: number;
  /** Its jobs waiting, retrying or running. */
  unfinished: number;
  /** Its dead-lettered events. */
  dead: number;
  /** Redeliveries its inbox acknowledged without running the handler. */
  duplicatesRejected: number;
}

/** The relay and consumer parts of `mailroom.stats()`. */
export interface EventStats {
  relay: Record<string, RelayTargetStats>;
  consumers: Record<string, ConsumerGroupStats>;
}

/** Reads relay and consumer health from the database (every process's work counts). */
export async function readEventStats(driver: Driver, relay: RelayQueries, consumers: ConsumerQueries): Promise<EventStats> {
  const [targets, groups] = await Promise.all([
    runReport<{ target: string; holder: string | null; locked_until: Date | null; unpublished: number; lag_seconds: number; behind_fence: number; fence: string; parked: number }>(
      driver,
      relay.cursorStats,
      [],
    ),
    runReport<{ name: string; source: string | null; duplicates_rejected: number; unfinished: number; dead: number; unrelayed: number }>(
      driver,
      consumers.groupStats,
      [INTERNAL_TARGET],
    ),
  ]);
  const result: EventStats = { relay: {}, consumers: {} };
  for (const t of targets.rows) {
    const leased = t.holder !== null && t.locked_until !== null && new Date(t.locked_until).getTime() > Date.now();
    result.relay[t.target] = {
      unpublished: t.unpublished,
      lagSeconds: Math.round(t.lag_seconds * 1000) / 1000,
      heldBackBy: t.behind_fence > 0 ? await findHolder(driver, relay, BigInt(t.fence)) : null,
      holder: leased ? t.holder : null,
      parked: t.parked,
    };
  }
  for (const g of groups.rows) {
    result.consumers[g.name] = { source: g.source, lag: g.unrelayed + g.unfinished, unrelayed: g.unrelayed, unfinished: g.unfinished, dead: g.dead, duplicatesRejected: g.duplicates_rejected };
  }
  return result;
}
