/**
 * Checks a loaded config value before anything is opened: unknown keys (with
 * a did-you-mean), and every option through the same validation the library
 * runs (`mailroom.worker()`, `mailroom.consumer()`, `mailroom.relay()`,
 * retention), so a mistake is reported with its key path instead of at the
 * moment the component would start.
 */
import { closest, redactUrl } from '../cli/args.ts';
import { CONSUMER_OPTION_NAMES, resolveConsumerOptions, type ConsumerOptions } from '../consumers/options.ts';
import { toMilliseconds } from '../duration.ts';
import { MailroomError, ValidationError } from '../errors.ts';
import { assertSource } from '../events/envelope.ts';
import { assertName, quoteSchema } from '../identifiers.ts';
import type { QueueSettings } from '../mailroom.ts';
import { checkMetricsOptions, type MetricsOptions } from '../observe/metrics.ts';
import { resolveDashboardOptions, type DashboardOptions } from '../dashboard/options.ts';
import { checkRedactPaths } from '../observe/redact.ts';
import { INTERNAL_TARGET } from '../relay/internal-target.ts';
import { RELAY_OPTION_NAMES, resolveRelayOptions, type RelayOptions } from '../relay/options.ts';
import type { RelayTarget } from '../relay/target.ts';
import { resolveRetention, type RetentionOptions } from '../retention.ts';
import { resolveWorkerOptions, WORKER_OPTION_NAMES, type WorkerOptions } from '../worker/options.ts';
import { ConfigProblem } from './config-error.ts';
import type { DashboardConfig, MailroomConfig, MetricsConfig } from './define-config.ts';
import { childPath } from './key-path.ts';
import { resolveStallCheck, type StallCheckOptions } from '../storage/stall-check-options.ts';

/** Whether the config came from JSON (data only) or from code (may hold handlers and targets). */
export type ConfigKind = 'json' | 'code';

type Keys<T> = Record<keyof T, true>;

// `satisfies` keeps these lists equal to the option types: a new option that is not listed fails to compile.
const TOP_KEYS = {
  database: true,
  schema: true,
  maxPayloadBytes: true,
  poolSize: true,
  rescueInterval: true,
  retention: true,
  source: true,
  queues: true,
  redact: true,
  logger: true,
  migrate: true,
  workers: true,
  consumers: true,
  relay: true,
  metrics: true,
  dashboard: true,
  shutdownTimeout: true,
  stallCheck: true,
} satisfies Keys<MailroomConfig>;
const JSON_KEYS = ['database', 'schema', 'maxPayloadBytes', 'poolSize', 'rescueInterval', 'retention', 'source', 'queues', 'redact', 'migrate', 'relay', 'metrics', 'dashboard', 'shutdownTimeout', 'stallCheck'];
const WORKER_KEYS = WORKER_OPTION_NAMES;
const CONSUMER_KEYS = CONSUMER_OPTION_NAMES;
const RELAY_KEYS = RELAY_OPTION_NAMES;
const METRICS_KEYS = { port: true, host: true, path: true, prefix: true, drainTargetSeconds: true, workerConcurrency: true } satisfies Keys<MetricsConfig>;
const QUEUE_KEYS = { owner: true } satisfies Keys<QueueSettings>;
const RETENTION_KEYS = { completed: true, dead: true, dedupKeys: true, batchSize: true, interval: true } satisfies Keys<RetentionOptions>;
const RETENTION_COMPLETED_KEYS = { age: true, count: true } satisfies Keys<NonNullable<RetentionOptions['completed']>>;
const RETENTION_DEAD_KEYS = { age: true } satisfies Keys<NonNullable<RetentionOptions['dead']>>;

/** A stand-in for the internal fan-out, so relay options can be checked before a database is open. */
const CHECK_ONLY_TARGET: RelayTarget = { name: INTERNAL_TARGET, publish: async () => {} };

type Plain = Record<string, unknown>;

function isPlainObject(value: unknown): value is Plain {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return false;
  const proto = Object.getPrototypeOf(value) as unknown;
  return proto === Object.prototype || proto === null;
}

function typeName(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'string') return `the string ${JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value)}`;
  if (typeof value === 'object') return 'an object';
  return `${typeof value} ${String(value)}`;
}

function expectObject(value: unknown, path: string, what: string): asserts value is Plain {
  if (!isPlainObject(value)) throw new ConfigProblem(path, `expected ${what}, got ${typeName(value)}`);
}

function checkKeys(value: Plain, known: Record<string, true>, path: string): void {
  const names = Object.keys(known);
  for (const key of Object.keys(value)) {
    if (Object.hasOwn(known, key)) continue;
    const guess = closest(key, names);
    throw new ConfigProblem(
      childPath(path, key),
      `unknown key ${JSON.stringify(key)}${guess ? `; did you mean "${guess}"?` : ''}`,
      `${path === '' ? 'the config' : path} takes ${names.join(', ')}`,
    );
  }
}

/** `worker: concurrency must be …` → `concurrency must be …` (the key path already says whose). */
function withoutPrefix(message: string): string {
  const match = /^([^:"'`]{1,40}): (.+)$/s.exec(message);
  return match ? match[2]! : message;
}

/**
 * The key path a library ValidationError is about: its issue path when that
 * is a key of the checked object (`concurrency`), else the last word of it
 * when that is one (`worker lease` → `lease`), else the object itself.
 */
function problemPath(base: string, value: Plain, error: Error): string {
  const issue = error instanceof ValidationError ? error.issues[0]?.path : undefined;
  const redactIndex = /^redact\[(\d+)\]/.exec(error.message);
  if (redactIndex) return `redact[${redactIndex[1]}]`;
  if (issue === undefined) return base;
  const [head, ...rest] = issue.split('.');
  if (head !== undefined && Object.hasOwn(value, head)) {
    let path = childPath(base, head);
    const tail = rest.join('.');
    if (tail === '') return path;
    const inner = value[head];
    if (isPlainObject(inner) && Object.hasOwn(inner, tail)) return childPath(path, tail); // handlers["order.created"]
    for (const part of rest) path = childPath(path, part);
    return path;
  }
  const last = issue.split(/[\s:]+/).filter(Boolean).at(-1);
  if (last !== undefined && Object.hasOwn(value, last)) return childPath(base, last);
  return base;
}

/** Runs a library check; its ValidationError (or TypeError) becomes a ConfigProblem at the right key path. */
function check(base: string, value: Plain, run: () => void): void {
  try {
    run();
  } catch (error) {
    if (error instanceof ValidationError || error instanceof MailroomError || error instanceof TypeError) {
      throw new ConfigProblem(problemPath(base, value, error), withoutPrefix(error.message));
    }
    throw error;
  }
}

function checkDuration(config: Plain, key: string): void {
  if (config[key] === undefined) return;
  check('', config, () => toMilliseconds(config[key] as never, key));
}

function checkInteger(config: Plain, path: string, key: string, min: number, max: number): void {
  const value = config[key];
  if (value === undefined) return;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    throw new ConfigProblem(childPath(path, key), `expected a whole number from ${min} to ${max}, got ${typeName(value)}`);
  }
}

function codeOnly(path: string, what: string): ConfigProblem {
  return new ConfigProblem(
    path,
    `${what}: a JSON config cannot hold code`,
    `write the config as mailroom.config.ts (or .js / .mjs) and import them there; a JSON config takes only ${JSON_KEYS.join(', ')} (relay without to)`,
  );
}

function checkHandlers(handlers: unknown, path: string): void {
  if (!isPlainObject(handlers)) throw new ConfigProblem(path, `expected an object of job type -> handler function, got ${typeName(handlers)}`);
  const names = Object.keys(handlers);
  if (names.length === 0) {
    throw new ConfigProblem(path, 'no handlers: this worker would dead-letter every job it claims as unknown-type', 'add { [job.name]: handler } entries, or remove the worker');
  }
  for (const name of names) {
    if (typeof handlers[name] !== 'function') throw new ConfigProblem(childPath(path, name), `expected a handler function, got ${typeName(handlers[name])}`);
  }
}

function checkWorkers(list: unknown, kind: ConfigKind): void {
  if (list === undefined) return;
  if (kind === 'json') {
    if (Array.isArray(list) && list.length === 0) return;
    throw codeOnly('workers', 'workers need handlers, which are functions');
  }
  if (!Array.isArray(list)) throw new ConfigProblem('workers', `expected an array of worker options, got ${typeName(list)}`);
  for (const [i, worker] of list.entries()) {
    const path = `workers[${i}]`;
    expectObject(worker, path, 'worker options ({ queues, handlers, concurrency, … })');
    checkKeys(worker, WORKER_KEYS, path);
    checkHandlers(worker.handlers, `${path}.handlers`);
    check(path, worker, () => resolveWorkerOptions(worker as unknown as WorkerOptions));
  }
}

function checkConsumers(list: unknown, kind: ConfigKind): void {
  if (list === undefined) return;
  if (kind === 'json') {
    if (Array.isArray(list) && list.length === 0) return;
    throw codeOnly('consumers', 'consumer groups need handlers, which are functions');
  }
  if (!Array.isArray(list)) throw new ConfigProblem('consumers', `expected an array of consumer options, got ${typeName(list)}`);
  const groups = new Set<string>();
  for (const [i, consumer] of list.entries()) {
    const path = `consumers[${i}]`;
    expectObject(consumer, path, 'consumer options ({ group, handlers, … })');
    checkKeys(consumer, CONSUMER_KEYS, path);
    check(path, consumer, () => resolveConsumerOptions(consumer as unknown as ConsumerOptions));
    const group = consumer.group as string;
    if (groups.has(group)) throw new ConfigProblem(`${path}.group`, `the group ${JSON.stringify(group)} is listed twice`, 'one entry per group; raise its concurrency instead');
    groups.add(group);
  }
}

function checkRelay(relay: unknown, kind: ConfigKind): void {
  if (relay === undefined || relay === false) return;
  expectObject(relay, 'relay', 'relay options ({} for the consumer groups of this database) or false');
  checkKeys(relay, RELAY_KEYS, 'relay');
  if (kind === 'json' && relay.to !== undefined && !(Array.isArray(relay.to) && relay.to.length === 0)) {
    throw codeOnly('relay.to', 'relay targets (rabbitmq(…), nats(…), redisStreams(…)) are objects made by code');
  }
  check('relay', relay, () => resolveRelayOptions(relay as RelayOptions, CHECK_ONLY_TARGET));
}

/** `port` and `host` of an endpoint `start` serves (metrics, dashboard). */
function checkListening(endpoint: Plain, path: string): void {
  checkInteger(endpoint, path, 'port', 0, 65_535);
  if (endpoint.host !== undefined && (typeof endpoint.host !== 'string' || endpoint.host.trim() === '')) {
    throw new ConfigProblem(`${path}.host`, `expected an address such as '127.0.0.1' or '0.0.0.0', got ${typeName(endpoint.host)}`);
  }
}

function checkMetrics(config: Plain): void {
  const metrics = config.metrics;
  if (metrics === undefined || metrics === false) return;
  expectObject(metrics, 'metrics', '{ port, host, path, … } or false');
  checkKeys(metrics, METRICS_KEYS, 'metrics');
  checkListening(metrics, 'metrics');
  if (metrics.path !== undefined && (typeof metrics.path !== 'string' || !/^\/[\x21-\x7e]*$/.test(metrics.path) || metrics.path === '/healthz')) {
    throw new ConfigProblem('metrics.path', `expected a path such as '/metrics' (starting with '/', not '/healthz'), got ${typeName(metrics.path)}`);
  }
  const { port: _port, host: _host, path: _path, ...options } = metrics;
  check('', config, () => checkMetricsOptions(options as MetricsOptions));
}

const DASHBOARD_KEYS = { port: true, host: true, token: true, readOnly: true } satisfies Keys<DashboardConfig>;

function checkDashboard(config: Plain): void {
  const dashboard = config.dashboard;
  if (dashboard === undefined || dashboard === false) return;
  expectObject(dashboard, 'dashboard', '{ port, host, readOnly, token } or false');
  checkKeys(dashboard, DASHBOARD_KEYS, 'dashboard');
  checkListening(dashboard, 'dashboard');
  const { port: _port, host: _host, ...options } = dashboard;
  check('dashboard', dashboard, () => resolveDashboardOptions(options as DashboardOptions));
}

function checkQueues(queues: unknown): void {
  if (queues === undefined) return;
  expectObject(queues, 'queues', 'an object of queue name -> { owner }');
  for (const [name, settings] of Object.entries(queues)) {
    const path = childPath('queues', name);
    try {
      assertName(name, 'queue name');
    } catch (error) {
      throw new ConfigProblem(path, withoutPrefix((error as Error).message));
    }
    expectObject(settings, path, "{ owner: 'team' }");
    checkKeys(settings, QUEUE_KEYS, path);
    if (settings.owner !== undefined && (typeof settings.owner !== 'string' || settings.owner.trim() === '')) {
      throw new ConfigProblem(`${path}.owner`, `expected the owning team's name, got ${typeName(settings.owner)}`);
    }
  }
}

function checkRetention(config: Plain): void {
  const retention = config.retention;
  if (retention === undefined) return;
  expectObject(retention, 'retention', 'retention options ({ completed, dead, dedupKeys, … })');
  checkKeys(retention, RETENTION_KEYS, 'retention');
  if (retention.completed !== undefined) {
    expectObject(retention.completed, 'retention.completed', '{ age, count }');
    checkKeys(retention.completed, RETENTION_COMPLETED_KEYS, 'retention.completed');
  }
  if (retention.dead !== undefined) {
    expectObject(retention.dead, 'retention.dead', '{ age }');
    checkKeys(retention.dead, RETENTION_DEAD_KEYS, 'retention.dead');
  }
  check('', config, () => resolveRetention(retention as RetentionOptions));
}

function checkDatabase(database: unknown, kind: ConfigKind): void {
  if (database === undefined || database === '') return;
  if (typeof database === 'string') {
    if (!/^postgres(ql)?:\/\/./.test(database)) {
      throw new ConfigProblem(
        'database',
        `expected a postgres:// URL, got ${JSON.stringify(redactUrl(database))}`,
        'write it like postgres://user:password@host:5432/dbname, or leave it out (then --database, else DATABASE_URL, else the embedded database in ./.mailroom)',
      );
    }
    return;
  }
  if (kind === 'code' && typeof database === 'object' && database !== null) return; // a pg.Pool or PGlite: createMailroom checks it
  throw new ConfigProblem('database', `expected a postgres:// URL${kind === 'code' ? ', a pg.Pool or a PGlite instance' : ''}, got ${typeName(database)}`);
}

/**
 * Checks a config value as loaded from a file, or throws a {@link ConfigProblem}
 * naming the key path. `kind: 'json'` refuses what only code can hold
 * (handlers, relay targets).
 *
 * @example
 * const config = validateConfig(JSON.parse(text), 'json');
 */
export function validateConfig(value: unknown, kind: ConfigKind): MailroomConfig {
  if (!isPlainObject(value)) {
    throw new ConfigProblem(
      '',
      `the config must be an object, got ${typeName(value)}`,
      kind === 'json' ? 'write an object such as { "schema": "mailroom", "migrate": true }' : 'export default defineConfig({ … }) (or a function returning it)',
    );
  }
  checkKeys(value, TOP_KEYS, '');
  checkDatabase(value.database, kind);
  if (value.logger !== undefined) {
    if (kind === 'json') throw codeOnly('logger', 'a logger (pino, or any object with error/warn/info) is an object made by code');
    if (typeof value.logger !== 'object' || value.logger === null) throw new ConfigProblem('logger', `expected a logger such as pino() (error/warn/info methods), got ${typeName(value.logger)}`);
  }
  if (value.schema !== undefined) check('', value, () => quoteSchema(value.schema as string));
  checkInteger(value, '', 'poolSize', 2, 10_000);
  checkInteger(value, '', 'maxPayloadBytes', 1, Number.MAX_SAFE_INTEGER);
  checkDuration(value, 'rescueInterval');
  checkDuration(value, 'shutdownTimeout');
  if (value.stallCheck !== undefined) check('', value, () => resolveStallCheck(value.stallCheck as StallCheckOptions | false));
  if (value.source !== undefined) check('', value, () => assertSource(value.source, 'source'));
  checkQueues(value.queues);
  if (value.redact !== undefined) check('redact', value, () => checkRedactPaths(value.redact));
  checkRetention(value);
  if (value.migrate !== undefined && typeof value.migrate !== 'boolean') {
    throw new ConfigProblem('migrate', `expected true or false, got ${typeName(value.migrate)}`);
  }
  checkWorkers(value.workers, kind);
  checkConsumers(value.consumers, kind);
  checkRelay(value.relay, kind);
  checkMetrics(value);
  checkDashboard(value);
  return value as MailroomConfig;
}
