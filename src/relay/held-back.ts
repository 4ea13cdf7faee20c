import type { Queryable } from '../storage/driver.ts';
import type { RelayQueries } from './relay-queries.ts';

/** The open transaction that holds a relay back. */
export interface HeldBackBy {
  /** Its backend's process id (`pg_stat_activity.pid`), or null when it cannot be seen (see docs/EVENTS.md). */
  pid: number | null;
  /** How long its transaction has been open, in seconds, or null when unknown. */
  ageSeconds: number | null;
  /** The fence: the oldest transaction id still running (xid8, as text). */
  xid: string;
  database: string | null;
  applicationName: string | null;
}

/**
 * Names the transaction that holds the fence: the session whose transaction
 * id is the fence's. Any transaction on the server counts, in any database.
 * Without one in sight (PGlite's single connection, a prepared transaction,
 * a role that may not see other sessions) pid and age are null.
 */
export async function findHolder(db: Queryable, queries: RelayQueries, fence: bigint): Promise<HeldBackBy> {
  const { rows } = await db.query<{ pid: number; xid: string; age_seconds: number; database: string | null; application_name: string | null }>(
    queries.oldestTransaction.text,
  );
  const row = rows[0];
  if (row && BigInt(row.xid) === (fence & 0xffffffffn)) {
    return { pid: row.pid, ageSeconds: Math.round(row.age_seconds * 1000) / 1000, xid: String(fence), database: row.database, applicationName: row.application_name || null };
  }
  return { pid: null, ageSeconds: null, xid: String(fence), database: null, applicationName: null };
}
