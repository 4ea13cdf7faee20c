/**
 * The jobs of a test's schema as per-key ordering tests compare them: each
 * job's number (from its payload), key, ordering_seq, blocked flag and state;
 * and an insert started while a completion of its key is in flight.
 */
import assert from 'node:assert/strict';
import pg from 'pg';
import { databaseUrl, type TestMailroom } from './databases.ts';

export interface OrderingRow {
  queue: string;
  n: number;
  key: string | null;
  seq: string | null;
  blocked: boolean;
  state: string;
}

/**
 * Every job of `t`'s schema, by queue and number; `n` is the SQL expression of
 * the job's number in its payload (a constant of the test, never user input).
 *
 * @example
 * const rows = await orderingRows(t, `payload->>'n'`);
 */
export async function orderingRows(t: TestMailroom, n: string): Promise<OrderingRow[]> {
  return t.sql<OrderingRow>(
    `SELECT queue, (${n})::int AS n, ordering_key AS key, ordering_seq::text AS seq, blocked, state
       FROM "${t.schema}".jobs ORDER BY queue, (${n})::int`,
  );
}

/** The jobs of one queue and key as `n:blocked|runnable`, in ordering_seq order. */
export function keyOrder(rows: OrderingRow[], queue: string, key: string): string[] {
  return rows
    .filter((r) => r.queue === queue && r.key === key)
    .sort((a, b) => (BigInt(a.seq!) < BigInt(b.seq!) ? -1 : 1))
    .map((r) => `${r.n}:${r.blocked ? 'blocked' : 'runnable'}`);
}

/**
 * Starts `insert` while another session has completed the jobs of `key` in a
 * transaction still open (its release found nothing behind them), asserts
 * that `insert` waits for that key (300 ms), commits the completion, and
 * returns what `insert` resolves to. Needs PostgreSQL (two sessions).
 *
 * @example
 * const ids = await duringCompletionOfKey(t, 'k', () => mailroom.enqueueMany(job, items, { orderingKey: 'k' }));
 */
export async function duringCompletionOfKey<T>(t: TestMailroom, key: string, insert: () => Promise<T>): Promise<T> {
  const other = new pg.Client({ connectionString: databaseUrl });
  await other.connect();
  try {
    await other.query('BEGIN');
    await other.query(`UPDATE "${t.schema}".jobs SET state = 'completed', finished_at = now() WHERE ordering_key = $1`, [key]);
    let settled = false;
    const inserting = insert().finally(() => (settled = true));
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(settled, false, `the insert waits for the key ${key} the completion holds`);
    await other.query('COMMIT');
    return await inserting;
  } finally {
    await other.end();
  }
}
