/**
 * Prometheus metrics of one mailroom instance (prom-client): a Registry of its
 * own, made on first use, with counters fed by lifecycle events, gauges read
 * from `stats()` at scrape time, and prom-client's default process metrics.
 */
import { collectDefaultMetrics, Registry } from 'prom-client';
import { ValidationError } from '../errors.ts';
import type { MailroomStats } from '../stats.ts';
import { resolveDesiredWorkersOptions, type DesiredWorkersOptions } from './desired-workers.ts';
import type { MailroomEvents } from './lifecycle.ts';
import { registerEventMetrics } from './metric-counters.ts';
import { registerStatsMetrics } from './metric-gauges.ts';

/** The `metrics` option of `createMailroom`. */
export interface MetricsOptions extends DesiredWorkersOptions {
  /**
   * Put in front of every metric name, mailroom's and prom-client's default
   * ones (e.g. `'billing_'` gives `billing_mailroom_jobs`), so two instances'
   * registries can be merged. Default none. The shipped alerts and dashboard
   * expect no prefix.
   */
  prefix?: string;
}

/** What the metrics read from a mailroom instance. */
export interface MetricsSource {
  on<K extends keyof MailroomEvents>(event: K, listener: (...args: MailroomEvents[K]) => void): unknown;
  stats(): Promise<MailroomStats>;
  ownerOf(queue: string): string | null;
}

/** The metrics of one instance. */
export interface MailroomMetrics {
  readonly registry: Registry;
  /** Prometheus text exposition of everything in the registry. */
  text(): Promise<string>;
}

/** How long one `stats()` result serves scrapes (every gauge of a scrape shares it), in ms. */
const STATS_TTL_MS = 1000;

const PREFIX = /^([a-zA-Z_:][a-zA-Z0-9_:]*)?$/;

/** Validates the `metrics` option (a ValidationError naming the field) so a mistake shows at `createMailroom`. */
export function checkMetricsOptions(options: MetricsOptions = {}): void {
  resolveDesiredWorkersOptions(options);
  if (options.prefix !== undefined && (typeof options.prefix !== 'string' || !PREFIX.test(options.prefix))) {
    throw new ValidationError(`metrics.prefix must be letters, digits, _ or : and not start with a digit (e.g. 'billing_'), got ${JSON.stringify(options.prefix)}`, [
      { path: 'metrics.prefix', message: 'invalid' },
    ]);
  }
}

/**
 * Makes the registry and subscribes its counters to `source`'s events. Events
 * before this call are not counted: touch `mailroom.metricsRegistry` at startup
 * to count from the start. `internal.statsTtlMs` (tests) changes how long one
 * `stats()` result serves scrapes (default 1 s).
 *
 * @example
 * const metrics = createMetrics(mailroom, { drainTargetSeconds: 120 }); await metrics.text();
 */
export function createMetrics(source: MetricsSource, options: MetricsOptions = {}, internal: { statsTtlMs?: number } = {}): MailroomMetrics {
  checkMetricsOptions(options);
  const prefix = options.prefix ?? '';
  const registry = new Registry();
  const seen = new Set<string>();
  registerEventMetrics(source, registry, prefix, seen);
  registerStatsMetrics(source, registry, { prefix, seen, scaling: resolveDesiredWorkersOptions(options), statsTtlMs: internal.statsTtlMs ?? STATS_TTL_MS });
  collectDefaultMetrics({ register: registry, prefix });
  return { registry, text: () => registry.metrics() };
}
