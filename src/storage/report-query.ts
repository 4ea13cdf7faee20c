import type { Driver, NamedQuery, QueryResult } from './driver.ts';

/**
 * Runs a report: a statement that reads much and runs rarely (stats, a
 * dead-letter count), without JIT compilation on PostgreSQL. Their per-row
 * subqueries are priced high enough for PostgreSQL to compile them, which
 * took longer than running them: 0.3 s more for `stats()` with one consumer
 * group over a million jobs, 0.4-0.7 s for a dead-letter count that runs in
 * milliseconds. On PGlite (no JIT) it is a plain `run`.
 *
 * @example
 * const { rows } = await runReport(driver, queries.queueCounts, []);
 */
export function runReport<R>(driver: Driver, query: NamedQuery, params: readonly unknown[]): Promise<QueryResult<R>> {
  if (driver.kind === 'pglite') return driver.run<R>(query, params);
  return driver.transaction((tx) => tx.run<R>(query, params), { jit: false });
}
