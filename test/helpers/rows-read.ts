import type pg from 'pg';

/**
 * How many rows of `schema.table` have been read so far (sequential scans and
 * index fetches), as PostgreSQL's statistics count them, with this session's
 * own counts flushed first. Take it before and after a statement: the
 * difference is what the statement read.
 *
 * @example
 * const before = await rowsRead(session, schema, 'jobs'); await session.query(…); const read = (await rowsRead(session, schema, 'jobs')) - before;
 */
export async function rowsRead(session: pg.Client, schema: string, table: string): Promise<number> {
  await session.query('SELECT pg_stat_force_next_flush()');
  await session.query('SELECT pg_stat_clear_snapshot()');
  const { rows } = await session.query<{ n: string }>(
    `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) AS n FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`,
    [schema, table],
  );
  return Number(rows[0]!.n);
}
