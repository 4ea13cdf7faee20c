/**
 * The jobs of a test's schema as per-key ordering tests compare them: each
 * job's number (from its payload), key, ordering_seq, blocked flag and state.
 */
import type { TestMailroom } from './databases.ts';

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
