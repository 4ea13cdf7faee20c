import type { Driver } from '../storage/driver.ts';
import type { JobQueries } from '../jobs/queries.ts';

interface Pending {
  id: string;
  claim: number;
  resolve: (recorded: boolean) => void;
  reject: (error: unknown) => void;
}

/**
 * Batches completions: every job that finishes while a flush is in flight
 * joins the next one, so under load one UPDATE completes many jobs and under
 * light load a completion is written at once. Each completion is fenced by the
 * job's claim token; `complete()` resolves to false for a job this worker no
 * longer owned.
 */
export class Completer {
  private pending: Pending[] = [];
  private flushing: Promise<void> | undefined;

  constructor(
    private readonly driver: Driver,
    private readonly queries: JobQueries,
    private readonly maxBatch = 1000,
  ) {}

  complete(id: string, claim: number): Promise<boolean> {
    return new Promise((resolve, reject) => {
      this.pending.push({ id, claim, resolve, reject });
      if (!this.flushing) this.flushing = this.flushLoop();
    });
  }

  /** Drops completions not yet sent, as a crash would. */
  abandon(): void {
    for (const p of this.pending.splice(0)) p.resolve(false);
  }

  /** Resolves when everything handed in so far is written. */
  async drain(): Promise<void> {
    while (this.flushing) await this.flushing;
  }

  private async flushLoop(): Promise<void> {
    try {
      await new Promise<void>((resolve) => setImmediate(resolve));
      while (this.pending.length > 0) {
        // Sorted by id: the heartbeat locks its rows in the same order, so the two cannot deadlock.
        const batch = this.pending.splice(0, this.maxBatch).sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
        try {
          const { rows } = await this.driver.run<{ id: string }>(this.queries.complete, [batch.map((p) => p.id), batch.map((p) => p.claim)]);
          const recorded = new Set(rows.map((r) => r.id));
          for (const p of batch) p.resolve(recorded.has(p.id));
        } catch (error) {
          for (const p of batch) p.reject(error);
        }
      }
    } finally {
      this.flushing = undefined;
    }
  }
}
