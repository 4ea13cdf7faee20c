/**
 * Reading a batch outside the round that delivers it, for targets that do not
 * write through the round's transaction (brokers). The relay reads batch k+1
 * while the broker confirms batch k, so a round costs the longer of the two
 * instead of their sum. The cursor still only moves after the confirm, by a
 * fenced statement; batch k+1 is published only after batch k was confirmed
 * (wire order is outbox order), and is dropped when k fails or the lease is lost.
 */
import type { Driver, Queryable } from '../storage/driver.ts';
import { planBatch, readFence, type BatchPlan, type OutboxPoint, type Runner } from './read-batch.ts';
import type { RelayQueries } from './relay-queries.ts';
import { StoredEvent } from './stored-event.ts';
import type { RelayedEvent } from './target.ts';

/** A batch read ahead of its delivery. */
export interface ReadBatch {
  /** The lease token it was read under. */
  token: string;
  /** Where it starts (the cursor it was planned from). */
  from: OutboxPoint;
  plan: BatchPlan;
  events: RelayedEvent[];
}

/** What reading a batch needs. */
export interface ReadBatchInput {
  driver: Driver;
  queries: RelayQueries;
  target: string;
  holder: string;
  token: string;
  leaseMs: number;
  batchSize: number;
  /** Plan from here (the batch before it, not yet confirmed); null: from the cursor in the database, renewing the lease. */
  from: OutboxPoint | null;
}

/**
 * Reads the next batch: past the batch before it with no transaction (usually
 * one statement), or from the database's cursor in a short transaction that
 * renews the lease. Null when the lease is lost (only checked when reading
 * from the database's cursor; the cursor's fenced advance checks it in every
 * case).
 */
export async function readBatch(input: ReadBatchInput): Promise<ReadBatch | null> {
  const { driver, queries } = input;
  const batch = (from: OutboxPoint, planned: BatchPlan): ReadBatch => ({ token: input.token, from, plan: planned, events: planned.rows.map((row) => new StoredEvent(row)) });
  const from = input.from;
  // Past a batch not yet confirmed: a read needs no lock, and usually one statement (which reads the fence too).
  if (from !== null) return batch(from, await planBatch(driver, queries, from, null, input.batchSize));
  // From the cursor: the fence is read before the transaction takes its lock (and so an xid of its own).
  const fence = await readFence(driver, queries);
  const plan = (db: Runner, from: OutboxPoint) => planBatch(db, queries, from, fence, input.batchSize);
  return driver.transaction(async (tx) => {
    const begun = await tx.run<{ cursor_xid: string; cursor_position: string }>(queries.beginRound, [input.target, input.holder, input.token, input.leaseMs]);
    const row = begun.rows[0];
    if (!row) return null;
    const cursor = { xid: BigInt(row.cursor_xid), position: BigInt(row.cursor_position) };
    return batch(cursor, await plan(tx, cursor));
  });
}

/** The `context.tx` of a read-ahead target: it has no transaction, and says so if used. */
export const NO_TRANSACTION: Queryable = {
  query() {
    return Promise.reject(
      new Error('this relay target declared readAhead: true, so its publish runs outside the relay\'s transaction and context.tx cannot be used; drop readAhead to write through context.tx'),
    );
  },
};
