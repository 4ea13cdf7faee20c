/**
 * The shape of `mailroom.config.ts` (or `.js`, `.mjs`, `.json`): what
 * `mailroom start` opens and runs. Every option is one the library already
 * has; the config only gathers them in one file.
 */
import type { Duration } from '../duration.ts';
import type { ConsumerOptions } from '../consumers/options.ts';
import type { MailroomOptions } from '../mailroom.ts';
import type { MetricsOptions } from '../observe/metrics.ts';
import type { DashboardOptions } from '../dashboard/options.ts';
import type { RelayOptions } from '../relay/options.ts';
import type { WorkerOptions } from '../worker/options.ts';

/**
 * The metrics of `mailroom start`: where it serves `GET /metrics` (Prometheus
 * text) and `GET /healthz`, plus the options of `mailroom.metrics()` itself
 * (`prefix`, `drainTargetSeconds`, `workerConcurrency`).
 */
export interface MetricsConfig extends MetricsOptions {
  /** TCP port. Default 9464 (Prometheus' conventional exporter port); `--port` overrides it. */
  port?: number;
  /** Address to listen on. Default `'127.0.0.1'` (loopback only); `'0.0.0.0'` for every interface. */
  host?: string;
  /** Path of the metrics page. Default `'/metrics'`. */
  path?: string;
}

/**
 * A config file for `mailroom start`: the options of `createMailroom`, the
 * workers, consumer groups and relay to run, the metrics endpoint, and how
 * long a graceful stop may take.
 */
export interface MailroomConfig extends Omit<MailroomOptions, 'metrics'> {
  /** Apply pending migrations at start (`mailroom migrate`). Default false: start refuses a schema that is not up to date. */
  migrate?: boolean;
  /** Workers to run, each as `mailroom.worker(options)` takes it. They also run maintenance (lease rescue, retention). */
  workers?: WorkerOptions[];
  /** Consumer groups to run, each as `mailroom.consumer(options)` takes it. */
  consumers?: ConsumerOptions[];
  /**
   * Run a relay (`mailroom.relay(options)`): `{}` delivers the outbox to this
   * database's consumer groups; `to` adds broker targets. Unset or false: no relay in this process.
   */
  relay?: RelayOptions | false;
  /**
   * The `/metrics` and `/healthz` endpoint and the metrics' options; false
   * turns the endpoint off. Default `{ port: 9464, host: '127.0.0.1', path: '/metrics' }`.
   */
  metrics?: MetricsConfig | false;
  /**
   * Serve the web dashboard too (docs/OPERATIONS.md, "`mailroom dashboard`").
   * Default: not served.
   */
  dashboard?: DashboardConfig | false;
  /** How long SIGTERM / SIGINT waits for running handlers before handing their jobs back. Default `'30s'`. */
  shutdownTimeout?: Duration;
}

/** The dashboard of `mailroom start`: where it listens, and the options of `createDashboard`. */
export interface DashboardConfig extends DashboardOptions {
  /** Default 4000. */
  port?: number;
  /** Default `'127.0.0.1'`. */
  host?: string;
}

/** What a config file's default export may be: the config, or a function (maybe async) that returns it. */
export type MailroomConfigExport = MailroomConfig | Promise<MailroomConfig> | (() => MailroomConfig | Promise<MailroomConfig>);

/**
 * Returns `config` unchanged; it only gives a config file its types (and
 * your editor its completions).
 *
 * @example
 * // mailroom.config.ts
 * import { defineConfig } from 'mailroom';
 * import { sendWelcome, onSendWelcome } from './jobs/welcome.ts';
 *
 * export default defineConfig({
 *   database: process.env.DATABASE_URL,
 *   workers: [{ queues: ['email'], concurrency: 5, handlers: { [sendWelcome.name]: onSendWelcome } }],
 *   relay: {},
 *   metrics: { port: 9464 },
 * });
 */
export function defineConfig<T extends MailroomConfigExport>(config: T): T {
  return config;
}
