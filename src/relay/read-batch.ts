import type { Queryable } from '../storage/driver.ts';
import type { RelayQueries } from './relay-queries.ts';

/** A point in the relay's read order: (xid, position). */
export interface OutboxPoint {
  xid: bigint;
  position: bigint;
}

interface Candidate extends OutboxPoint {
  subject: string | null;
}

/** What one read decided. */
export interface BatchPlan {
  /** Positions to deliver, ascending (per-key order). */
  positions: string[];
  /** The new cursor: the last delivered row in (xid, position) order. */
  cursor: OutboxPoint | null;
  /** True when a row could not be delivered because an earlier row of its key waits behind the fence. */
  blocked: boolean;
  /** The xid of that earlier row (null when not blocked). */
  blockedBy: bigint | null;
  /** True when every row below the fence was read (nothing more is eligible now). */
  exhausted: boolean;
}

/** Compares two points in (xid, position) order. */
export function comparePoints(a: OutboxPoint, b: OutboxPoint): number {
  if (a.xid !== b.xid) return a.xid < b.xid ? -1 : 1;
  return a.position < b.position ? -1 : a.position > b.position ? 1 : 0;
}

const point = (row: { xid: string; position: string }): OutboxPoint => ({ xid: BigInt(row.xid), position: BigInt(row.position) });

/**
 * Plans the next batch of one relay target, inside its round's transaction.
 *
 * Rows are read past the cursor in (xid, position) order, only below the fence
 * (every transaction below it has ended, so no row can appear there later).
 * That order is not per-key order: a transaction may get its xid before
 * another, then take a key after the other committed. So a row may have
 * same-key predecessors (lower position) that are not delivered and lie
 * further on in (xid, position) order. A batch may only end at a row r such
 * that every predecessor of every row up to r is at or before r; the plan
 * takes the longest such prefix (reading on past `batchSize` when it must, to
 * reach one), and stops before a row whose predecessor is behind the fence
 * (its transaction committed but an older one is still open). The batch is
 * delivered in position order, which is per-key commit order.
 */
export async function planBatch(db: Queryable, queries: RelayQueries, cursor: OutboxPoint, fence: bigint, batchSize: number): Promise<BatchPlan> {
  const scanned: Candidate[] = [];
  let lastClosed = -1; // index of the last row at which a batch may end
  let need: OutboxPoint = cursor; // the furthest predecessor required by the rows scanned so far
  let from = cursor;
  let blocked = false;
  let blockedBy: bigint | null = null;
  let exhausted = false;
  const top = new Map<string, bigint>(); // highest scanned position per key
  for (;;) {
    const { rows } = await db.query<{ position: string; xid: string; subject: string | null }>(queries.candidates.text, [
      String(from.xid),
      String(from.position),
      String(fence),
      batchSize,
    ]);
    const chunk: Candidate[] = rows.map((r) => ({ ...point(r), subject: r.subject }));
    if (chunk.length < batchSize) exhausted = true;
    for (const c of chunk) if (c.subject !== null && (top.get(c.subject) ?? -1n) < c.position) top.set(c.subject, c.position);
    const chunkKeys = new Map<string, bigint>();
    for (const c of chunk) if (c.subject !== null) chunkKeys.set(c.subject, top.get(c.subject)!);
    const predecessors = await readPredecessors(db, queries, chunkKeys, cursor);
    for (const row of chunk) {
      if (row.subject !== null) {
        for (const p of predecessors.get(row.subject) ?? []) {
          if (p.position >= row.position) continue;
          if (p.xid >= fence) {
            blocked = true;
            blockedBy = p.xid;
            break;
          }
          if (comparePoints(p, need) > 0) need = p;
        }
        if (blocked) break;
      }
      scanned.push(row);
      if (comparePoints(need, row) <= 0) lastClosed = scanned.length - 1;
    }
    if (blocked || exhausted) break;
    if (lastClosed >= 0 && scanned.length >= batchSize) break;
    from = chunk.at(-1)!;
  }
  const batch = scanned.slice(0, lastClosed + 1);
  const end = batch.at(-1);
  return {
    positions: batch.map((r) => r.position).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0)).map(String),
    cursor: end ? { xid: end.xid, position: end.position } : null,
    blocked,
    blockedBy,
    exhausted: exhausted && !blocked && lastClosed === scanned.length - 1,
  };
}

async function readPredecessors(db: Queryable, queries: RelayQueries, top: Map<string, bigint>, cursor: OutboxPoint): Promise<Map<string, OutboxPoint[]>> {
  const byKey = new Map<string, OutboxPoint[]>();
  if (top.size === 0) return byKey;
  const keys = [...top.keys()];
  const { rows } = await db.query<{ subject: string; position: string; xid: string }>(queries.predecessors.text, [
    keys,
    keys.map((k) => String(top.get(k))),
    String(cursor.xid),
    String(cursor.position),
  ]);
  for (const r of rows) {
    const list = byKey.get(r.subject) ?? [];
    list.push(point(r));
    byKey.set(r.subject, list);
  }
  return byKey;
}
