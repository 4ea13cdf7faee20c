import type { JobQueries } from '../jobs/queries.ts';
import type { Driver } from '../storage/driver.ts';
import type { RetentionQueries } from '../jobs/retention-queries.ts';
import { prune, type RetentionPolicy } from '../retention.ts';
import type { AnalyzedTable } from '../storage/statistics.ts';
import { PeriodicPass, RUN_TO_END, type PassControl } from '../storage/periodic-pass.ts';

const RESCUE_BATCH = 500;

/** A job taken back from an expired lease: to `retrying`, or `dead` when out of attempts or past maxAge. */
export interface RescuedJob {
  id: string;
  queue: string;
  type: string;
  attempt: number;
  dead: boolean;
}

interface RescuedRow {
  id: string;
  queue: string;
  type: string;
  attempt: number;
  state: string;
}
export const LEASE_EXPIRED_MESSAGE = 'lease expired: the worker stopped renewing it (crashed, killed, paused or cut off from the database)';

/**
 * Rescues jobs whose lease expired: each goes back to `retrying` (or to `dead`
 * when it has used its attempts or outlived maxAge), with the attempt counted
 * and a `lease-expired` error in its history. Runs in bounded batches; safe to
 * run in many processes at once.
 */
export class Maintenance {
  private readonly rescuing: PeriodicPass;
  private readonly pruning: PeriodicPass;
  private users = 0;

  constructor(
    private readonly driver: Driver,
    private readonly queries: JobQueries,
    private readonly retentionQueries: RetentionQueries,
    private readonly retention: RetentionPolicy,
    intervalMs: number,
    onError: (error: unknown) => void,
    private readonly onRescued: (job: RescuedJob) => void = () => {},
    /** Analyzes the tables whose statistics fell behind (src/storage/statistics.ts). */
    private readonly refreshStatistics: (signal?: AbortSignal) => Promise<AnalyzedTable[]> = async () => [],
  ) {
    this.rescuing = new PeriodicPass(
      'lease rescue',
      intervalMs,
      (pass) => this.rescueExpired(pass).then(() => (pass.stopped() ? [] : this.analyzeStale(pass.signal))),
      onError,
    );
    this.pruning = new PeriodicPass('retention', retention.intervalMs, (pass) => this.prune(pass), onError);
  }

  /** One statistics pass: analyzes the tables that grew past twice the size their statistics recorded. */
  analyzeStale(signal?: AbortSignal): Promise<AnalyzedTable[]> {
    return this.refreshStatistics(signal);
  }

  /** One retention pass: deletes finished jobs past their retention, in bounded batches (no more once `pass.stopped()`). */
  prune(pass: PassControl = RUN_TO_END): Promise<number> {
    return prune(this.driver, this.retentionQueries, this.retention, pass);
  }

  /** One pass: rescues every expired lease now (no more batches once `pass.stopped()`). Returns how many jobs it rescued. */
  async rescueExpired(pass: PassControl = RUN_TO_END): Promise<number> {
    let total = 0;
    for (;;) {
      const { rows } = await this.driver.run<RescuedRow>(this.queries.rescueExpired, [RESCUE_BATCH, LEASE_EXPIRED_MESSAGE], { signal: pass.signal });
      total += rows.length;
      for (const row of rows) this.onRescued({ id: row.id, queue: row.queue, type: row.type, attempt: row.attempt, dead: row.state === 'dead' });
      if (rows.length < RESCUE_BATCH || pass.stopped()) return total;
    }
  }

  /** Starts the periodic loop (reference-counted: one loop however many workers share it). */
  start(): void {
    this.users++;
    this.rescuing.start();
    this.pruning.start();
  }

  /**
   * Stops the loop when its last user stops, and resolves once a pass in
   * flight has ended (after its current batch; a pass called directly runs on),
   * cancelling its statement after `limitMs`.
   */
  async stop(limitMs = Number.POSITIVE_INFINITY): Promise<void> {
    this.users = Math.max(0, this.users - 1);
    if (this.users > 0) return;
    await Promise.all([this.rescuing.stop(limitMs), this.pruning.stop(limitMs)]);
  }
}
