import { toMilliseconds, type Duration } from '../duration.ts';
import { ValidationError } from '../errors.ts';
import type { ControlQueries } from '../jobs/control-queries.ts';
import type { JobQueries } from '../jobs/queries.ts';
import type { Driver } from '../storage/driver.ts';
import type { ClaimedRow } from './types.ts';
import type { FollowerClaim } from './chains.ts';

/** A rate limit shared by every process: at most `max` jobs started in any window of `per`. */
export interface RateLimit {
  max: number;
  per: Duration;
}

const REFRESH_MS = 2000;

function checkPositiveInteger(value: unknown, path: string): number {
  if (!Number.isInteger(value) || (value as number) < 1 || (value as number) > 1_000_000) {
    throw new ValidationError(`worker: ${path} must be a positive integer (1 to 1000000), got ${String(value)}`, [{ path, message: 'must be >= 1' }]);
  }
  return value as number;
}

/** Validates a rate limit; returns it in milliseconds. */
export function resolveRateLimit(limit: RateLimit): { max: number; perMs: number } {
  if (typeof limit !== 'object' || limit === null) {
    throw new ValidationError('worker: rateLimit must be { max, per }, e.g. { max: 20, per: "1s" }', [{ path: 'rateLimit', message: 'invalid' }]);
  }
  const max = checkPositiveInteger(limit.max, 'rateLimit.max');
  const perMs = toMilliseconds(limit.per, 'rateLimit.per');
  if (perMs < 1) throw new ValidationError('worker: rateLimit.per must be positive', [{ path: 'rateLimit.per', message: 'must be > 0' }]);
  return { max, perMs };
}

/** Validates a global (all processes) concurrency limit. */
export function resolveGlobalConcurrency(value: unknown): number {
  return checkPositiveInteger(value, 'globalConcurrency');
}

/**
 * Which of a worker's queues carry shared limits, and how to claim from them.
 * A queue with a control row is claimed through it (rate window, global
 * concurrency, back-off); other queues take the plain, faster claim, or, once
 * a claim brought a job with an ordering key, the claim that takes followers.
 */
export class QueueControls {
  private controlled = new Set<string>();
  /** Queues that gave this worker a job with an ordering key. */
  private readonly keyed = new Set<string>();
  private refreshedAt = 0;

  constructor(
    private readonly driver: Driver,
    private readonly jobQueries: JobQueries,
    private readonly queries: ControlQueries,
    private readonly queues: readonly string[],
  ) {}

  /** Writes this worker's limits for its queues (the last worker to start sets them). */
  async configure(rate: { max: number; perMs: number } | null, concurrency: number | null): Promise<void> {
    for (const queue of this.queues) {
      await this.driver.run(this.queries.configure, [queue, rate?.max ?? null, rate?.perMs ?? null, concurrency]);
    }
    await this.refresh();
  }

  private async refresh(): Promise<void> {
    const { rows } = await this.driver.run<{ queue: string }>(this.queries.controlledAmong, [this.queues]);
    this.controlled = new Set(rows.map((r) => r.queue));
    this.refreshedAt = Date.now();
  }

  /** Whether `queue` had shared limits (a rate limit, global concurrency or a back-off) at the last look. */
  limits(queue: string): boolean {
    return this.controlled.has(queue);
  }

  /**
   * Claims up to `limit` jobs from `queue`, within its shared limits if it has any. Without limits,
   * up to `chains.perHead` jobs behind each head of an ordering key, and behind each of the
   * `chains.anchors` (the last followers of this worker's chains), come too, `chains.room` at most
   * (see Chains); a queue with limits counts every job it starts, so there each job is claimed as a head.
   */
  async claim(queue: string, limit: number, leaseMs: number, workerId: string, chains: FollowerClaim): Promise<ClaimedRow[]> {
    if (Date.now() - this.refreshedAt > REFRESH_MS) await this.refresh();
    const params = [queue, limit, leaseMs, workerId];
    if (!this.controlled.has(queue)) {
      if (!this.keyed.has(queue) || chains.perHead === 0) {
        const { rows } = await this.driver.run<ClaimedRow>(this.jobQueries.claim, params);
        if (rows.some((r) => r.ordering_key !== null)) this.keyed.add(queue);
        return rows;
      }
      const { perHead, anchors, room } = chains;
      const chained = [perHead, anchors.map((a) => a.id), anchors.map((a) => a.claim), room];
      return (await this.driver.run<ClaimedRow>(this.jobQueries.claimWithFollowers, [...params, ...chained])).rows;
    }
    return this.driver.transaction(async (tx) => {
      await tx.run(this.queries.lock, [queue]);
      return (await tx.run<ClaimedRow>(this.queries.claimControlled, params)).rows;
    });
  }

  /** Backs the whole queue off for `delayMs`, in every process. */
  async pause(queue: string, delayMs: number): Promise<void> {
    await this.driver.run(this.queries.pause, [queue, delayMs]);
    this.controlled.add(queue);
  }
}
