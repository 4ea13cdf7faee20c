import type { AdminQueries } from './jobs/admin-queries.ts';
import type { ConsumerGroupStats, RelayTargetStats } from './events/event-stats.ts';
import type { Driver } from './storage/driver.ts';
import { runReport } from './storage/report-query.ts';

/** Health numbers of one queue. */
export interface QueueStats {
  /** Due now and waiting for a worker. */
  available: number;
  /** Waiting for their run time (delayed or snoozed). */
  scheduled: number;
  /** Failed, waiting for their next attempt. */
  retrying: number;
  /** Waiting behind an earlier job with the same ordering key. */
  blocked: number;
  active: number;
  dead: number;
  /** How long the oldest available job has been due, in seconds (0 when none). */
  oldestAgeSeconds: number;
  /** Completions per second over the last minute. */
  completedPerSecond: number;
  /** Failed attempts per second over the last minute. */
  failedPerSecond: number;
}

/** Row versions of one of mailroom's tables, from PostgreSQL's statistics (approximate; zero on PGlite). */
export interface TableStats {
  liveRows: number;
  /** Dead row versions that vacuum has not removed yet: many more than live ones is bloat (docs/OPERATIONS.md). */
  deadRows: number;
  /** Seconds since the table was last vacuumed (by hand or autovacuum); null when never. */
  secondsSinceVacuum: number | null;
}

/** The tables `stats().tables` reports: the ones updated or deleted from most. */
export const WATCHED_TABLES = ['jobs', 'job_errors', 'outbox', 'outbox_keys', 'inbox', 'ordering_keys', 'idempotency_keys'] as const;

/** What `mailroom.stats()` returns. */
export interface MailroomStats {
  queues: Record<string, QueueStats>;
  /** Per table of mailroom's that is updated or pruned much: live and dead row versions (watch `deadRows`). */
  tables: Record<string, TableStats>;
  /** Per relay target (`internal` is the fan-out to consumer groups). */
  relay: Record<string, RelayTargetStats>;
  /** Per consumer group. */
  consumers: Record<string, ConsumerGroupStats>;
}

function empty(): QueueStats {
  return { available: 0, scheduled: 0, retrying: 0, blocked: 0, active: 0, dead: 0, oldestAgeSeconds: 0, completedPerSecond: 0, failedPerSecond: 0 };
}

/** Reads the per-queue health numbers from the database (all processes' work counts). */
export async function readStats(driver: Driver, queries: AdminQueries): Promise<Pick<MailroomStats, 'queues' | 'tables'>> {
  const [counts, completed, failed, health] = await Promise.all([
    runReport<Omit<QueueStats, 'oldestAgeSeconds' | 'completedPerSecond' | 'failedPerSecond'> & { queue: string; oldest_age_seconds: number }>(
      driver,
      queries.queueCounts,
      [],
    ),
    runReport<{ queue: string; n: number }>(driver, queries.completedLastMinute, []),
    runReport<{ queue: string; n: number }>(driver, queries.failedLastMinute, []),
    driver.run<{ table: string; live: number; dead: number; since_vacuum: number | null }>(queries.tableHealth, [[...WATCHED_TABLES]]),
  ]);
  const queues: Record<string, QueueStats> = {};
  const get = (queue: string) => (queues[queue] ??= empty());
  for (const row of counts.rows) {
    const { queue, oldest_age_seconds, ...rest } = row;
    Object.assign(get(queue), rest, { oldestAgeSeconds: Math.round(oldest_age_seconds * 1000) / 1000 });
  }
  for (const row of completed.rows) get(row.queue).completedPerSecond = Math.round((row.n / 60) * 1000) / 1000;
  for (const row of failed.rows) get(row.queue).failedPerSecond = Math.round((row.n / 60) * 1000) / 1000;
  const tables: Record<string, TableStats> = {};
  for (const row of health.rows) {
    tables[row.table] = { liveRows: row.live, deadRows: row.dead, secondsSinceVacuum: row.since_vacuum === null ? null : Math.round(row.since_vacuum) };
  }
  return { queues, tables };
}
