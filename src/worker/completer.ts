import type { Driver, NamedQuery } from '../storage/driver.ts';
import { CoalescingBatch } from '../storage/coalescing-batch.ts';
import { isConcurrencyConflict } from '../storage/conflicts.ts';
import type { JobQueries } from '../jobs/queries.ts';
import type { InboxKey } from './job-run.ts';

interface Completion {
  id: string;
  claim: number;
  inbox: InboxKey | undefined;
}

/** What the completer needs from its worker. */
export interface CompleterHooks {
  /** Called with each failed write that will be retried. */
  report(error: unknown): void;
  /** True when retrying is pointless (the worker was stopped or abandoned). */
  givingUp(): boolean;
  /** Runs the write in the worker's lane for multi-row writes (see SerialLane). */
  serialize<T>(write: () => Promise<T>): Promise<T>;
}

const MAX_ATTEMPTS = 6;

/**
 * Batches completions: every job that finishes while a flush is in flight
 * joins the next one, so under load one UPDATE completes many jobs and under
 * light load a completion is written at once. Each completion is fenced by the
 * job's claim token; `complete()` resolves to false for a job this worker no
 * longer owned. A batch whose write fails (the database restarting) is
 * retried with backoff, then rejected: those jobs are left to lease expiry.
 */
export class Completer {
  private readonly batches: CoalescingBatch<Completion, boolean>;

  constructor(
    private readonly driver: Driver,
    private readonly queries: JobQueries,
    private readonly hooks: CompleterHooks,
    maxBatch = 1000,
  ) {
    this.batches = new CoalescingBatch(async (batch) => {
      const recorded = await this.write(batch);
      return batch.map((c) => recorded.has(c.id));
    }, maxBatch);
  }

  /** Completes a job (fenced by its claim); `inbox` is a consumer's key, recorded with the completion when it is written. */
  complete(id: string, claim: number, inbox?: InboxKey): Promise<boolean> {
    return this.batches.add({ id, claim, inbox });
  }

  /** Drops completions not yet sent, as a crash would. */
  abandon(): void {
    this.batches.settleUnsent(false);
  }

  /** Resolves when everything handed in so far is written. */
  async drain(): Promise<void> {
    await this.batches.drain();
  }

  /** The statement for a batch: with inbox keys, recording them; a batch of one (a quiet queue, a key's chain) the one planned once per connection. */
  private statementFor(batch: Completion[]): [NamedQuery, unknown[]] {
    const ids = batch.map((p) => p.id);
    const claims = batch.map((p) => p.claim);
    if (batch.some((p) => p.inbox !== undefined)) {
      return [this.queries.completeRecordingInbox, [ids, claims, batch.map((p) => p.inbox?.group ?? null), batch.map((p) => p.inbox?.key ?? null)]];
    }
    return batch.length === 1 ? [this.queries.completeOne, [ids[0], claims[0]]] : [this.queries.complete, [ids, claims]];
  }

  private async write(batch: Completion[]): Promise<Set<string>> {
    const [query, params] = this.statementFor(batch);
    let delay = 100;
    for (let attempt = 1; ; attempt++) {
      try {
        const { rows } = await this.hooks.serialize(() => this.driver.run<{ id: string }>(query, params));
        return new Set(rows.map((r) => r.id));
      } catch (error) {
        if (attempt >= MAX_ATTEMPTS || this.hooks.givingUp()) throw error;
        // A deadlock or serialization failure with another transaction (key rows are taken in key
        // order everywhere, but a caller's own transaction may take rows in any order) was rolled
        // back: the first one is run again at once and not reported.
        if (attempt === 1 && isConcurrencyConflict(error)) continue;
        this.hooks.report(error);
        await new Promise((resolve) => setTimeout(resolve, delay));
        delay = Math.min(delay * 2, 5000);
      }
    }
  }
}
