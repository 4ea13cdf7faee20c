/**
 * Keeps the planner's statistics of mailroom's growing tables (jobs, outbox,
 * inbox) from falling far behind the tables, where autovacuum does not: on a
 * server with autovacuum off, and on PGlite, which runs no autovacuum.
 *
 * Why it matters: a connection keeps a prepared statement's generic plan until
 * the table's statistics change. A worker that starts on an empty queue plans
 * its claim and completion while the jobs table is a page or two, where
 * reading the whole table is the cheapest plan; without a later ANALYZE that
 * plan stays, and every claim and completion reads all of the growing history
 * (measured: 0.5 ms per claim with 3,000 rows, and growing with the table).
 *
 * The check is one read of `pg_class`: a table is analyzed once it is at least
 * {@link MIN_PAGES} pages and more than twice the size its statistics last
 * recorded, so a table that autovacuum keeps analyzed is left alone, and one it
 * does not is analyzed at each doubling. `ANALYZE (SKIP_LOCKED)` leaves a table
 * another session is analyzing; tables the role does not own are skipped.
 */
import type { Driver, NamedQuery } from './driver.ts';
import { namedQueries } from './named.ts';

/** The tables whose hot statements read them by index once they have rows: constants, never user input. */
export const ANALYZED_TABLES = ['jobs', 'outbox', 'inbox'] as const;
export type AnalyzedTable = (typeof ANALYZED_TABLES)[number];

/** Below this many pages (8 kB each) a table is read whole in any plan at little cost. */
export const MIN_PAGES = 8;

/** The statements of the statistics check, for one quoted schema. */
export interface StatisticsQueries {
  /** $1 the tables' qualified names, $2 {@link MIN_PAGES}: the tables grown past twice their recorded size. */
  stale: NamedQuery;
  /** One `ANALYZE` per table (utility statements take no parameters). */
  analyze: Record<AnalyzedTable, string>;
}

/** Builds the statistics statements for a quoted schema name. */
export function statisticsQueries(quotedSchema: string): StatisticsQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  const pages = `pg_relation_size(c.oid) / current_setting('block_size')::int`;
  return {
    stale: q(
      'statistics_stale',
      `SELECT c.relname::text AS table
         FROM pg_class AS c
        WHERE c.oid = ANY ($1::regclass[]) AND pg_has_role(c.relowner, 'USAGE')
          AND ${pages} >= $2::int AND ${pages} > 2 * c.relpages
        ORDER BY c.relname`,
    ),
    analyze: Object.fromEntries(ANALYZED_TABLES.map((table) => [table, `ANALYZE (SKIP_LOCKED) ${s}.${table}`])) as Record<AnalyzedTable, string>,
  };
}

/**
 * Analyzes the tables whose statistics fell behind (see the module comment);
 * resolves to their names. `signal` cancels the statement in flight (a stop that stopped waiting).
 *
 * @example
 * const analyzed = await refreshStatistics(driver, statisticsQueries('"mailroom"'), '"mailroom"'); // ['jobs']
 */
export async function refreshStatistics(driver: Driver, queries: StatisticsQueries, quotedSchema: string, signal?: AbortSignal): Promise<AnalyzedTable[]> {
  const names = ANALYZED_TABLES.map((table) => `${quotedSchema}.${table}`);
  const { rows } = await driver.run<{ table: string }>(queries.stale, [names, MIN_PAGES], { signal });
  const stale = rows.map((r) => r.table).filter((t): t is AnalyzedTable => (ANALYZED_TABLES as readonly string[]).includes(t));
  for (const table of stale) await driver.query(queries.analyze[table], [], { signal });
  return stale;
}
