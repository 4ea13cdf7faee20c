/**
 * The scaling signal `mailroom_desired_workers`: how many worker processes a
 * queue needs, from its depth, the age of its oldest waiting job and its
 * throughput (docs/OPERATIONS.md, "Autoscaling", explains the formula).
 */
import { ValidationError } from '../errors.ts';
import type { QueueStats } from '../stats.ts';

/** Settings of the scaling signal (the `metrics` option of `createMailroom`). */
export interface DesiredWorkersOptions {
  /** Waiting jobs should all have started within this many seconds. Default 60. */
  drainTargetSeconds?: number;
  /** Jobs one worker process runs at once (its `concurrency`). Default 10, the worker's default. */
  workerConcurrency?: number;
}

/** {@link DesiredWorkersOptions} with defaults filled in. */
export interface ResolvedDesiredWorkersOptions {
  drainTargetSeconds: number;
  workerConcurrency: number;
}

/** Validates the scaling settings (a ValidationError naming the option) and fills in defaults. */
export function resolveDesiredWorkersOptions(options: DesiredWorkersOptions = {}): ResolvedDesiredWorkersOptions {
  const drainTargetSeconds = options.drainTargetSeconds ?? 60;
  if (typeof drainTargetSeconds !== 'number' || !Number.isFinite(drainTargetSeconds) || drainTargetSeconds <= 0) {
    throw new ValidationError(`metrics.drainTargetSeconds must be a positive number of seconds (e.g. 60), got ${String(options.drainTargetSeconds)}`, [
      { path: 'metrics.drainTargetSeconds', message: 'invalid' },
    ]);
  }
  const workerConcurrency = options.workerConcurrency ?? 10;
  if (!Number.isInteger(workerConcurrency) || workerConcurrency < 1) {
    throw new ValidationError(
      `metrics.workerConcurrency must be a positive integer: the concurrency your worker processes run with (default 10), got ${String(options.workerConcurrency)}`,
      [{ path: 'metrics.workerConcurrency', message: 'invalid' }],
    );
  }
  return { drainTargetSeconds, workerConcurrency };
}

/**
 * Worker processes a queue needs now: 0 when it has nothing waiting or running,
 * else at least 1. Busy slots (`active`, which by Little's law is arrival rate ×
 * mean handler time) plus the slots that start the waiting jobs within what is
 * left of the drain target (never less than a quarter of it), with the mean
 * handler time measured as `active / throughput`. When nothing finished in the
 * last minute the handler time is unknown: one more worker's worth of slots is
 * asked for while jobs wait.
 *
 * @example
 * desiredWorkers({ ...stats.queues.email, available: 600 }, { drainTargetSeconds: 60, workerConcurrency: 10 });
 */
export function desiredWorkers(
  queue: Pick<QueueStats, 'available' | 'active' | 'oldestAgeSeconds' | 'completedPerSecond' | 'failedPerSecond'>,
  options: ResolvedDesiredWorkersOptions,
): number {
  const { available, active, oldestAgeSeconds } = queue;
  if (available + active <= 0) return 0;
  const { drainTargetSeconds: target, workerConcurrency: perWorker } = options;
  const throughput = queue.completedPerSecond + queue.failedPerSecond;
  let slots: number;
  if (throughput > 0 && active > 0) {
    const handlerSeconds = active / throughput;
    const window = Math.max(target - oldestAgeSeconds, target / 4);
    slots = active + (available * handlerSeconds) / window;
  } else {
    slots = active + Math.min(available, perWorker);
  }
  // A hair of tolerance so 20.000000001 slots of 10 do not ask for a third worker.
  return Math.max(1, Math.ceil(slots / perWorker - 1e-9));
}
