import { hostname } from 'node:os';
import { checkOptionNames, type OptionNames } from '../option-names.ts';
import { toMilliseconds, type Duration } from '../duration.ts';
import { ValidationError } from '../errors.ts';
import { assertName } from '../identifiers.ts';
import { newId } from '../ids.ts';
import { resolveGlobalConcurrency, resolveRateLimit, type RateLimit } from './queue-controls.ts';
import type { JobHandler } from './types.ts';

/** Options of `mailroom.worker()`. */
export interface WorkerOptions {
  /** Queues to take jobs from. Default `['default']`. */
  queues?: string[];
  /** Handlers by job type name. A claimed job with no handler is dead-lettered as `unknown-type`. */
  handlers: Record<string, JobHandler>;
  /** Jobs run at once by this worker. Default 10. */
  concurrency?: number;
  /** How long a claim lasts without a heartbeat. Default `'30s'`. */
  lease?: Duration;
  /** How often to check for due jobs when no NOTIFY arrives. Default `'1s'`. */
  pollInterval?: Duration;
  /**
   * Jobs to claim ahead of free slots and hold in memory, so that one claim
   * fetches many jobs (throughput under load). Held jobs are leased and
   * heartbeated like running ones; a graceful stop hands them back unspent, a
   * crash leaves them to lease expiry (the attempt counts). Default 0.
   */
  prefetch?: number;
  /** Run the lease-rescue loop in this worker. Default true. */
  maintenance?: boolean;
  /** Identifies the worker in `locked_by`. Default host:pid:random. */
  id?: string;
  /**
   * At most `max` jobs of each of these queues start in any window of `per`, across all processes.
   * The limits live in the database: leaving both options out keeps what an earlier worker set;
   * `null` removes a limit (a worker that gives either option sets both).
   */
  rateLimit?: RateLimit | null;
  /** At most this many jobs of each of these queues are active at once, across all processes (`null` removes the limit). */
  globalConcurrency?: number | null;
}

/** Worker options validated, with defaults filled in. */
export interface ResolvedWorkerOptions {
  queues: string[];
  concurrency: number;
  prefetch: number;
  leaseMs: number;
  pollMs: number;
  id: string;
  rateLimit: { max: number; perMs: number } | null;
  globalConcurrency: number | null;
  /** True when either limit option was given (null included): the worker writes both at start. */
  setsLimits: boolean;
}

function invalid(path: string, message: string): ValidationError {
  return new ValidationError(message, [{ path, message }]);
}

/** Every option name of `worker()` (the config file's workers are checked against it too). */
export const WORKER_OPTION_NAMES: OptionNames<WorkerOptions> = {
  queues: true, handlers: true, concurrency: true, lease: true, pollInterval: true, prefetch: true,
  maintenance: true, id: true, rateLimit: true, globalConcurrency: true,
};

/** Validates worker options (a ValidationError naming the option) and fills in defaults. */
export function resolveWorkerOptions(options: WorkerOptions): ResolvedWorkerOptions {
  checkOptionNames(options, WORKER_OPTION_NAMES, 'worker');
  const queues = options.queues ?? ['default'];
  if (!Array.isArray(queues) || queues.length === 0) throw invalid('queues', 'worker: queues must be a non-empty array of queue names');
  for (const q of queues) assertName(q, 'worker queue');
  if (typeof options.handlers !== 'object' || options.handlers === null) {
    throw invalid('handlers', 'worker: handlers must be an object of job name -> handler function');
  }
  const concurrency = options.concurrency ?? 10;
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 10_000) {
    throw invalid('concurrency', `worker: concurrency must be an integer from 1 to 10000, got ${String(options.concurrency)}`);
  }
  const prefetch = options.prefetch ?? 0;
  if (!Number.isInteger(prefetch) || prefetch < 0 || prefetch > 10_000) {
    throw invalid('prefetch', `worker: prefetch must be an integer from 0 to 10000, got ${String(options.prefetch)}`);
  }
  const leaseMs = toMilliseconds(options.lease ?? '30s', 'worker lease');
  if (leaseMs < 100) throw invalid('lease', `worker: lease must be at least 100ms, got ${leaseMs} ms`);
  return {
    queues,
    concurrency,
    prefetch,
    leaseMs,
    pollMs: toMilliseconds(options.pollInterval ?? '1s', 'worker pollInterval'),
    id: options.id ?? `${hostname()}:${process.pid}:${newId().slice(-8)}`,
    rateLimit: options.rateLimit === undefined || options.rateLimit === null ? null : resolveRateLimit(options.rateLimit),
    globalConcurrency: options.globalConcurrency === undefined || options.globalConcurrency === null ? null : resolveGlobalConcurrency(options.globalConcurrency),
    setsLimits: options.rateLimit !== undefined || options.globalConcurrency !== undefined,
  };
}
