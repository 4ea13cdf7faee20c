import type { JobQueries } from '../jobs/queries.ts';
import type { Driver } from '../storage/driver.ts';
import type { RetentionQueries } from '../jobs/retention-queries.ts';
import { prune, type RetentionPolicy } from '../retention.ts';
import type { AnalyzedTable } from '../storage/statistics.ts';

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
  private timer: NodeJS.Timeout | undefined;
  private pruneTimer: NodeJS.Timeout | undefined;
  private running: Promise<unknown> | undefined;
  private pruning: Promise<unknown> | undefined;
  private users = 0;
  /** Set when the last user stops: the loop's pass in flight ends after its current batch (a pass called directly runs on). */
  private stopped = false;

  constructor(
    private readonly driver: Driver,
    private readonly queries: JobQueries,
    private readonly retentionQueries: RetentionQueries,
    private readonly retention: RetentionPolicy,
    private readonly intervalMs: number,
    private readonly onError: (error: unknown) => void,
    private readonly onRescued: (job: RescuedJob) => void = () => {},
    /** Analyzes the tables whose statistics fell behind (src/storage/statistics.ts). */
    private readonly refreshStatistics: () => Promise<AnalyzedTable[]> = async () => [],
  ) {}

  /** One statistics pass: analyzes the tables that grew past twice the size their statistics recorded. */
  analyzeStale(): Promise<AnalyzedTable[]> {
    return this.refreshStatistics();
  }

  /** One retention pass: deletes finished jobs past their retention, in bounded batches (no more once `stopped()`). */
  prune(stopped: () => boolean = () => false): Promise<number> {
    return prune(this.driver, this.retentionQueries, this.retention, stopped);
  }

  /** One pass: rescues every expired lease now (no more batches once `stopped()`). Returns how many jobs it rescued. */
  async rescueExpired(stopped: () => boolean = () => false): Promise<number> {
    let total = 0;
    for (;;) {
      const { rows } = await this.driver.run<RescuedRow>(this.queries.rescueExpired, [RESCUE_BATCH, LEASE_EXPIRED_MESSAGE]);
      total += rows.length;
      for (const row of rows) this.onRescued({ id: row.id, queue: row.queue, type: row.type, attempt: row.attempt, dead: row.state === 'dead' });
      if (rows.length < RESCUE_BATCH || stopped()) return total;
    }
  }

  /** Starts the periodic loop (reference-counted: one loop however many workers share it). */
  start(): void {
    this.users++;
    this.stopped = false;
    if (this.timer) return;
    this.timer = setInterval(() => {
      if (this.running) return;
      const stopped = () => this.stopped;
      this.running = this.rescueExpired(stopped)
        .then(() => (stopped() ? [] : this.analyzeStale()))
        .catch(this.onError)
        .finally(() => (this.running = undefined));
    }, this.intervalMs);
    this.timer.unref();
    this.pruneTimer = setInterval(() => {
      if (this.pruning) return;
      this.pruning = this.prune(() => this.stopped)
        .catch(this.onError)
        .finally(() => (this.pruning = undefined));
    }, this.retention.intervalMs);
    this.pruneTimer.unref();
  }

  /**
   * Stops the loop when its last user stops, and resolves once a pass in
   * flight has ended (after its current batch), so that closing the pool
   * next cuts no pass off.
   */
  async stop(): Promise<void> {
    this.users = Math.max(0, this.users - 1);
    if (this.users > 0) return;
    if (this.timer) {
      clearInterval(this.timer);
      clearInterval(this.pruneTimer);
      this.timer = undefined;
      this.pruneTimer = undefined;
    }
    this.stopped = true;
    await Promise.all([this.running, this.pruning]);
  }
}
