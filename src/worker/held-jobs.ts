import type { ClaimedRow } from './types.ts';

/**
 * Claimed jobs waiting for a free slot (prefetch), first in first out.
 * `Array.prototype.shift` copies the whole array on every call once it is
 * large; this queue moves a head index instead and compacts now and then.
 */
export class HeldJobs {
  private rows: ClaimedRow[] = [];
  private head = 0;

  get size(): number {
    return this.rows.length - this.head;
  }

  push(rows: readonly ClaimedRow[]): void {
    for (const row of rows) this.rows.push(row);
  }

  /** The oldest held job, or undefined when none is held. */
  take(): ClaimedRow | undefined {
    if (this.head >= this.rows.length) return undefined;
    const row = this.rows[this.head]!;
    this.rows[this.head++] = undefined as unknown as ClaimedRow; // let it be collected
    if (this.head === this.rows.length) {
      this.rows = [];
      this.head = 0;
    } else if (this.head >= 1024 && this.head * 2 >= this.rows.length) {
      this.rows = this.rows.slice(this.head);
      this.head = 0;
    }
    return row;
  }

  /** Every held job, oldest first (a copy). */
  toArray(): ClaimedRow[] {
    return this.rows.slice(this.head);
  }

  /** Removes and returns every held job. */
  takeAll(): ClaimedRow[] {
    const all = this.toArray();
    this.rows = [];
    this.head = 0;
    return all;
  }

  /** Drops the held jobs in `lost`; returns those that were still held. */
  remove(lost: ReadonlySet<ClaimedRow>): ClaimedRow[] {
    if (lost.size === 0) return [];
    const removed: ClaimedRow[] = [];
    const kept: ClaimedRow[] = [];
    for (const row of this.toArray()) (lost.has(row) ? removed : kept).push(row);
    this.rows = kept;
    this.head = 0;
    return removed;
  }
}
