import type { Transaction } from '../storage/driver.ts';
import type { RelayQueries } from './relay-queries.ts';
import type { StoredEventRow } from './stored-event.ts';
import { storedEventRow, unpackEventColumns, type PackedEventColumns, type StoredEventColumns } from '../events/envelope-sql.ts';

/** Runs mailroom's named statements: the driver, or a transaction of it. */
export type Runner = Pick<Transaction, 'run'>;

/** A point in the relay's read order: (xid, position). */
export interface OutboxPoint {
  xid: bigint;
  position: bigint;
}

/** What the candidates statement returns: the fence on every row, and with no row past the cursor one row of nulls. */
type CandidatesRow = { fence: string } & (PackedEventColumns | { [column in keyof PackedEventColumns]: null });

interface Candidate extends OutboxPoint {
  row: StoredEventColumns;
  /** The same key's previous row (a point at or before the cursor when delivered or none); null when not recorded. */
  prev: OutboxPoint | null;
}

/** What one read decided. */
export interface BatchPlan {
  /** The fence the batch was read below (given, or read by its first statement). */
  fence: bigint;
  /** The rows to deliver, in position order (per-key order). */
  rows: StoredEventRow[];
  /** The new cursor: the last delivered row in (xid, position) order. */
  cursor: OutboxPoint | null;
  /** True when a row could not be delivered because an earlier row of its key waits behind the fence. */
  blocked: boolean;
  /** The xid of that earlier row (null when not blocked). */
  blockedBy: bigint | null;
  /** True when every row below the fence was read (nothing more is eligible now). */
  exhausted: boolean;
}

/** The fence now: every transaction with an xid below it has ended. Read before a round's transaction takes a lock. */
export async function readFence(db: Runner, queries: RelayQueries): Promise<bigint> {
  const { rows } = await db.run<{ fence: string }>(queries.fence, []);
  return BigInt(rows[0]!.fence);
}

/** Compares two points in (xid, position) order. */
export function comparePoints(a: OutboxPoint, b: OutboxPoint): number {
  if (a.xid !== b.xid) return a.xid < b.xid ? -1 : 1;
  return a.position < b.position ? -1 : a.position > b.position ? 1 : 0;
}

const point = (row: { xid: string; position: string }): OutboxPoint => ({ xid: BigInt(row.xid), position: BigInt(row.position) });

/** The row's columns are kept as read; the envelope's text is built only for the rows a batch keeps. */
function candidate(packed: PackedEventColumns): Candidate {
  const { columns: row, prevPosition, prevXid } = unpackEventColumns(packed);
  const prev = prevPosition === null || prevXid === null ? null : { xid: BigInt(prevXid), position: BigInt(prevPosition) };
  return { xid: BigInt(row.xid), position: BigInt(row.position), row, prev };
}

/**
 * Plans the next batch of one relay target and reads its rows.
 *
 * Rows are read past the cursor in (xid, position) order, only below the fence
 * (every transaction below it has ended, so no row can appear there later).
 * That order is not per-key order: a transaction may get its xid before
 * another, then take a key after the other committed. So a row may have a
 * same-key predecessor (lower position) that is not delivered and lies
 * further on in (xid, position) order. A batch may only end at a row r such
 * that every predecessor of every row up to r is at or before r; the plan
 * takes the longest such prefix (reading on past `batchSize` when it must, to
 * reach one), and stops before a row whose predecessor is behind the fence
 * (its transaction committed but an older one is still open). The batch is
 * delivered in position order, which is per-key commit order.
 *
 * Each keyed row names its key's previous row (recorded by the publish under
 * the key lock, migration 12), which is enough: if a row's previous row comes
 * before it in this order, so do all earlier ones, by induction. Keys with a
 * row that names none (published under REPEATABLE READ or SERIALIZABLE, or
 * before migration 12) are walked down in the database instead.
 */
export async function planBatch(db: Runner, queries: RelayQueries, cursor: OutboxPoint, fenceGiven: bigint | null, batchSize: number): Promise<BatchPlan> {
  let fence = fenceGiven ?? -1n; // read by the first statement when not given
  const scanned: Candidate[] = [];
  let lastClosed = -1; // index of the last row at which a batch may end
  let need: OutboxPoint = cursor; // the furthest predecessor required by the rows scanned so far
  let from = cursor;
  let blocked = false;
  let blockedBy: bigint | null = null;
  let exhausted = false;
  const top = new Map<string, bigint>(); // highest scanned position per key
  /** Requires `p`, a predecessor of the row being scanned: false when it lies behind the fence. */
  const needs = (p: OutboxPoint): boolean => {
    if (comparePoints(p, cursor) <= 0) return true; // delivered already
    if (p.xid >= fence) {
      blocked = true;
      blockedBy = p.xid;
      return false;
    }
    if (comparePoints(p, need) > 0) need = p;
    return true;
  };
  for (;;) {
    const { rows } = await db.run<CandidatesRow>(queries.candidates, [String(from.xid), String(from.position), fence < 0n ? null : String(fence), batchSize]);
    fence = BigInt(rows[0]!.fence);
    const chunk = inReadOrder(rows.flatMap((row) => (row.packed === null ? [] : [candidate(row as PackedEventColumns)])));
    if (chunk.length < batchSize) exhausted = true;
    for (const c of chunk) if (c.row.subject !== null && (top.get(c.row.subject) ?? -1n) < c.position) top.set(c.row.subject, c.position);
    const walkKeys = new Map<string, bigint>();
    for (const c of chunk) if (c.row.subject !== null && c.prev === null) walkKeys.set(c.row.subject, top.get(c.row.subject)!);
    const walked = await readPredecessors(db, queries, walkKeys, cursor);
    for (const c of chunk) {
      const key = c.row.subject;
      if (key !== null) {
        if (walkKeys.has(key)) {
          for (const p of walked.get(key) ?? []) if (p.position < c.position && !needs(p)) break;
        } else if (c.prev !== null) {
          needs(c.prev);
        }
        if (blocked) break;
      }
      scanned.push(c);
      if (comparePoints(need, c) <= 0) lastClosed = scanned.length - 1;
    }
    if (blocked || exhausted) break;
    if (lastClosed >= 0 && scanned.length >= batchSize) break;
    from = chunk.at(-1)!;
  }
  // Every row below the fence past the cursor was read: a required row that was not among them no
  // longer exists (retention deleted it after every target then known had passed it; a target added
  // since starts before it). Nothing is left to wait for.
  if (exhausted && !blocked) lastClosed = scanned.length - 1;
  const batch = scanned.slice(0, lastClosed + 1);
  const end = batch.at(-1); // the cursor: the last in (xid, position) order, before sorting by position
  const next = end ? { xid: end.xid, position: end.position } : null;
  return {
    fence,
    rows: batch.sort((a, b) => (a.position < b.position ? -1 : a.position > b.position ? 1 : 0)).map((c) => storedEventRow(c.row)),
    cursor: next,
    blocked,
    blockedBy,
    exhausted: exhausted && !blocked,
  };
}

/** The candidates in (xid, position) order: as the statement returns them, sorted only if they ever are not. */
function inReadOrder(chunk: Candidate[]): Candidate[] {
  for (let i = 1; i < chunk.length; i++) if (comparePoints(chunk[i - 1]!, chunk[i]!) > 0) return chunk.sort(comparePoints);
  return chunk;
}

async function readPredecessors(db: Runner, queries: RelayQueries, top: Map<string, bigint>, cursor: OutboxPoint): Promise<Map<string, OutboxPoint[]>> {
  const byKey = new Map<string, OutboxPoint[]>();
  if (top.size === 0) return byKey;
  const keys = [...top.keys()];
  const { rows } = await db.run<{ subject: string; position: string; xid: string }>(queries.predecessors, [
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
