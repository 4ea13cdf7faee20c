/**
 * `mailroom start`: runs what a config file describes (workers with their
 * maintenance, consumer groups, a relay) and serves `/metrics` and `/healthz`
 * until SIGTERM or SIGINT, then stops gracefully: running handlers finish
 * (up to `shutdownTimeout`), the rest goes back to the queue. A second signal
 * exits at once with 130.
 */
import type { PGlite } from '@electric-sql/pglite';
import type pg from 'pg';
import type { MailroomConfig } from '../config/define-config.ts';
import { toMilliseconds } from '../duration.ts';
import { quoteSchema } from '../identifiers.ts';
import { createMailroom, type Mailroom } from '../mailroom.ts';
import { migrations } from '../storage/migrations.ts';
import { integerOption, stringOption, UsageError, type CommandSpec, type Io } from './args.ts';
import { describeTarget, openDatabase, resolveTarget, type DatabaseTarget } from './database.ts';
import { startMetricsServer, type MetricsServer } from './metrics-server.ts';
import { createDashboard } from '../dashboard/server.ts';
import { tokenFromEnvironment } from './dashboard.ts';
import { startQueries } from './start-queries.ts';
import { chooseDatabase, isTarget, loadCommandConfig } from './command-config.ts';

const DEFAULT_METRICS_PORT = 9464;
const DEFAULT_DASHBOARD_PORT = 4000;
const DEFAULT_SHUTDOWN_TIMEOUT = '30s';

/** Writes one line per step: text for people, or one JSON object per line with `--json`. */
type Say = (event: string, text: string, fields?: Record<string, unknown>) => void;

function sayer(io: Io, json: boolean): Say {
  return (event, text, fields = {}) => {
    io.out.write(json ? `${JSON.stringify({ event, ...fields })}\n` : `${text}\n`);
  };
}

/** SIGTERM / SIGINT: the first asks for a graceful stop, a second exits at once with 130. */
interface Signals {
  readonly requested: Promise<NodeJS.Signals>;
  readonly received: NodeJS.Signals | undefined;
  dispose(): void;
}

function watchSignals(io: Io): Signals {
  let received: NodeJS.Signals | undefined;
  let resolve!: (signal: NodeJS.Signals) => void;
  const requested = new Promise<NodeJS.Signals>((r) => (resolve = r));
  const onSignal = (signal: NodeJS.Signals) => {
    if (received !== undefined) {
      io.err.write(`mailroom start: ${signal} again: exiting now without waiting (running jobs go back to the queue when their lease expires)\n`);
      process.exit(130);
    }
    received = signal;
    resolve(signal);
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  return {
    requested,
    get received() {
      return received;
    },
    dispose() {
      process.off('SIGTERM', onSignal);
      process.off('SIGINT', onSignal);
    },
  };
}

/** Connections the workers and consumers can hold at once (a handler using ctx.tx holds one), plus room for heartbeats, claims and the relay. */
function defaultPoolSize(config: MailroomConfig): number {
  const handlers = [...(config.workers ?? []), ...(config.consumers ?? [])].reduce((sum, o) => sum + (o.concurrency ?? 10), 0);
  return Math.max(20, handlers + 5);
}

/** Refuses a schema that is missing or behind this version's migrations (unless the config says `migrate: true`). */
async function checkMigrated(handle: pg.Pool | PGlite, schema: string): Promise<void> {
  const quoted = quoteSchema(schema);
  const queries = startQueries(quoted);
  const query = async <R>(text: string, params: unknown[] = []) => ((await (handle as pg.Pool).query(text, params)).rows as R[]);
  const [table] = await query<{ present: boolean }>(queries.migrationsTable.text, [`${quoted}.migrations`]);
  const newest = migrations().at(-1)?.version ?? 0;
  const fix = 'run `mailroom migrate` with the same database and schema first, or set `migrate: true` in the config';
  if (!table?.present) throw new Error(`schema "${schema}" has no mailroom tables; ${fix}`);
  const [row] = await query<{ version: number }>(queries.appliedVersion.text);
  const version = Number(row?.version ?? 0);
  if (version < newest) throw new Error(`schema "${schema}" is at migration ${version}, and this mailroom needs ${newest}; ${fix}`);
}

/** Starts the components of the config on `mailroom`, printing one line each. */
async function startComponents(mailroom: Mailroom, config: MailroomConfig, say: Say): Promise<void> {
  for (const options of config.workers ?? []) {
    const worker = mailroom.worker(options);
    await worker.start();
    const queues = options.queues ?? ['default'];
    const types = Object.keys(options.handlers);
    say(
      'worker',
      `worker ${worker.id}: queues ${queues.join(', ')}, concurrency ${options.concurrency ?? 10}, ${types.length} job type${types.length === 1 ? '' : 's'}${options.maintenance === false ? '' : ', with maintenance'}`,
      { id: worker.id, queues, concurrency: options.concurrency ?? 10, types, maintenance: options.maintenance !== false },
    );
  }
  // The relay before the consumers: its targets declare what the consumers' sources read (a NATS stream, say).
  if (config.relay !== undefined && config.relay !== false) {
    const relay = mailroom.relay(config.relay);
    await relay.start();
    say('relay', `relay ${relay.id}: targets ${relay.targets.join(', ')}`, { id: relay.id, targets: relay.targets });
  } else if ((config.consumers ?? []).some((c) => c.source === undefined)) {
    say('note', 'note: no relay in this process (the config has no `relay`); internal consumer groups get events only while a relay runs somewhere', {});
  }
  for (const options of config.consumers ?? []) {
    const consumer = mailroom.consumer(options);
    await consumer.start();
    const types = Object.keys(options.handlers).sort();
    const from = options.source ? `${options.source.kind} ${options.source.name}` : 'the outbox (internal)';
    say('consumer', `consumer group ${consumer.group}: ${types.join(', ')} from ${from}`, { group: consumer.group, types, source: options.source ? { kind: options.source.kind, name: options.source.name } : null });
  }
  if (!config.workers?.length && !config.consumers?.length && (config.relay === undefined || config.relay === false)) {
    say('note', 'note: the config has no workers, consumers or relay; only the endpoint runs', {});
  }
}

async function runStart(values: Record<string, string | boolean | undefined>, io: Io): Promise<number> {
  const noMetrics = values['no-metrics'] === true;
  const portFlag = values.port === undefined ? undefined : integerOption(values.port, 'port', DEFAULT_METRICS_PORT, 0, 65_535);
  if (noMetrics && portFlag !== undefined) throw new UsageError('mailroom start: --port and --no-metrics cannot be used together', 'drop one of them');
  const say = sayer(io, values.json === true);
  const signals = watchSignals(io);
  let server: MetricsServer | null = null;
  let dashboard: { url: string; close(): Promise<void> } | null = null;
  let mailroom: Mailroom | undefined;
  let closeDatabase = async () => {};
  try {
    const loaded = (await loadCommandConfig(values, true))!;
    const { config } = loaded;
    const { migrate, workers: _w, consumers: _c, relay: _r, metrics, dashboard: dashboardConfig, shutdownTimeout, database: _d, ...options } = config;
    const { port: _port, host: _host, path: _path, ...metricsOptions } = metrics === false ? {} : (metrics ?? {});
    const timeout = shutdownTimeout ?? DEFAULT_SHUTDOWN_TIMEOUT;
    say('config', `config: ${loaded.display}`, { file: loaded.path });
    // A dashboard token from the environment (the config's own wins) is checked before anything starts.
    const envToken = dashboardConfig && dashboardConfig.token === undefined ? tokenFromEnvironment() : undefined;

    // The endpoint first: a port in use fails before anything has started.
    if (!noMetrics && metrics !== false) {
      server = await startMetricsServer({ host: metrics?.host ?? '127.0.0.1', port: portFlag ?? metrics?.port ?? DEFAULT_METRICS_PORT, path: metrics?.path ?? '/metrics' });
    }

    const chosen = chooseDatabase(values, config);
    let where: string;
    let handle: pg.Pool | PGlite;
    if (isTarget(chosen)) {
      const db = await openDatabase(chosen, options.poolSize ?? defaultPoolSize(config));
      handle = db.handle;
      closeDatabase = () => db.close();
      where = describeTarget(chosen);
    } else {
      handle = chosen;
      where = 'the database the config passes';
    }
    const schema = options.schema ?? 'mailroom';
    mailroom = await createMailroom({ ...options, metrics: metricsOptions, database: handle });
    // Made now, so the counters see every event from the start (the registry subscribes on first use).
    if (server) void mailroom.metricsRegistry;
    if (migrate === true) {
      const { applied } = await mailroom.migrate();
      say('database', `database: ${where}, schema "${schema}"${applied.length ? `, applied migration${applied.length === 1 ? '' : 's'} ${applied.join(', ')}` : ', migrations up to date'}`, { location: where, schema, applied });
    } else {
      await checkMigrated(handle, schema);
      say('database', `database: ${where}, schema "${schema}"`, { location: where, schema, applied: [] });
    }

    if (dashboardConfig) {
      // Before the components: a port in use fails before anything has started.
      const { port, host, ...dashboardOptions } = dashboardConfig;
      const made = createDashboard(mailroom, { token: envToken, ...dashboardOptions });
      dashboard = await made.listen(port ?? DEFAULT_DASHBOARD_PORT, host ?? '127.0.0.1');
      say('dashboard', `dashboard: ${dashboard.url}${made.readOnly ? ' (read-only)' : ''}`, { url: dashboard.url, readOnly: made.readOnly });
    }

    const timeoutText = typeof timeout === 'number' ? `${timeout} ms` : timeout;
    // A signal during start-up: nothing more is started, and the stop below runs at once.
    if (signals.received === undefined) {
      await startComponents(mailroom, config, say);
      if (server) {
        server.setSource(mailroom);
        server.setHealth('running');
        const health = new URL('/healthz', server.url).href;
        say('metrics', `metrics: ${server.url} (health: ${health})`, { url: server.url, health });
      }
      say('running', `running; SIGTERM or Ctrl-C stops gracefully (running jobs get up to ${timeoutText}), a second signal exits at once`, { pid: process.pid });
    }

    const signal = await signals.requested;
    server?.setHealth('stopping');
    say('stopping', `stopping (${signal}): waiting up to ${timeoutText} for running jobs; unfinished ones go back to the queue`, { signal, timeoutMs: toMilliseconds(timeout, 'shutdownTimeout') });
    const closing = mailroom;
    mailroom = undefined;
    await dashboard?.close();
    dashboard = null;
    await closing.close({ timeout });
    await closeDatabase();
    await server?.close();
    server = null;
    say('stopped', 'stopped', {});
    return 0;
  } finally {
    // Failing at start: undo what was opened (the error itself goes to main, which prints it and exits 1 or 2).
    if (mailroom) await mailroom.close({ timeout: '5s' }).catch(() => {});
    if (server) await server.close().catch(() => {});
    if (dashboard) await dashboard.close().catch(() => {});
    await closeDatabase().catch(() => {});
    signals.dispose();
  }
}

/** The `start` command. */
export const startCommand: CommandSpec = {
  name: 'start',
  summary: 'run the workers, consumer groups and relay of a config file, serving /metrics and /healthz',
  usage: 'mailroom start [--config PATH] [--database URL | --data-dir DIR] [--port PORT | --no-metrics] [--json]',
  options: {
    config: { type: 'string', value: 'PATH', description: 'the config file (default: the first of mailroom.config.ts, .mts, .js, .mjs, .json here)' },
    database: { type: 'string', value: 'URL', description: "PostgreSQL URL; overrides the config's database, which overrides $DATABASE_URL" },
    'data-dir': { type: 'string', value: 'DIR', description: 'directory of the embedded PGlite database (default ./.mailroom)' },
    port: { type: 'string', value: 'PORT', description: `port of /metrics and /healthz (overrides metrics.port; default ${DEFAULT_METRICS_PORT})` },
    'no-metrics': { type: 'boolean', description: 'serve no /metrics and /healthz' },
  },
  details: [
    'The config file exports (default export, or a function returning it) what createMailroom takes',
    '(database, schema, poolSize, queues, redact, retention, ...) plus: migrate (apply migrations at',
    'start; default false, and start refuses a schema that is behind), workers, consumers, relay ({}',
    'delivers the outbox to the consumer groups; unset: no relay here), metrics ({ port, host, path }',
    'and the options of mailroom.metrics(), or false) and shutdownTimeout (default 30s). A .json',
    'config holds only what needs no code: no workers or consumers (handlers are functions), no relay',
    "targets. Write it with defineConfig from 'mailroom'; .ts configs load through tsx (npm i -D tsx)",
    'when Node cannot load them itself.',
    '',
    'Database: --database (or --data-dir), else the config\'s database, else $DATABASE_URL, else the',
    'embedded database in ./.mailroom.',
    '',
    'GET /metrics: Prometheus text. GET /healthz: 200 "ok" while running, 503 while starting or stopping.',
    'Listens on 127.0.0.1:9464 unless metrics.host / metrics.port / --port say otherwise.',
    '',
    'SIGTERM or SIGINT: stop taking jobs, let running handlers finish (up to shutdownTimeout), hand the',
    'rest back, exit 0. A second signal exits at once with 130.',
    'Exit codes: 0 stopped by a signal, 1 could not start (database unreachable, port in use, schema',
    'not migrated), 2 bad usage or a bad config file (the message names the file and line).',
  ].join('\n'),
  run: runStart,
};
