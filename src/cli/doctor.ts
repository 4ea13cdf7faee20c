/**
 * `mailroom doctor`: checks brokers for settings that break mailroom's
 * guarantees (the adapters' own checks, the same ones the relay and consumers
 * run at start), without changing anything. The brokers come from flags, from
 * a config file's relay targets and consumer sources (doctor-config.ts), or both.
 * Exit 0: nothing found; 1: warnings (or a broker could not be checked); 2: usage.
 */
import { toMilliseconds } from '../duration.ts';
import type { SafetyWarning } from '../brokers/safety.ts';
import { republishHorizonMs as republishHorizonOf } from '../relay/relay.ts';
import { stringOption, UsageError, type CommandSpec } from './args.ts';
import { loadCommandConfig } from './command-config.ts';
import { configChecks, type Check } from './doctor-config.ts';
import { databaseCheck } from './doctor-database.ts';
import { DATABASE_OPTIONS } from './open-mailroom.ts';

/** Each broker flag, and the flags that only mean something beside it. */
const BROKER_FLAGS = { rabbitmq: ['exchange', 'queue', 'check-queue'], nats: ['stream', 'durable'], redis: ['redis-stream'] } as const;

/** Loads an adapter's module; a missing client is a clear error naming what to install. */
async function adapter<T>(load: () => Promise<T>, install: string): Promise<T> {
  try {
    return await load();
  } catch (error) {
    if ((error as { code?: string }).code === 'ERR_MODULE_NOT_FOUND') throw new Error(`this check needs ${install}: npm install ${install}`);
    throw error;
  }
}

function need(values: Record<string, string | boolean | undefined>, name: string, because: string): string {
  const value = stringOption(values[name]);
  if (value === undefined) throw new UsageError(`mailroom doctor: --${name} is required with ${because}`, `e.g. mailroom doctor ${because} --${name} NAME`);
  return value;
}

async function checksFor(values: Record<string, string | boolean | undefined>, republishHorizonMs: number): Promise<Check[]> {
  const checks: Check[] = [];
  const rabbitUrl = stringOption(values.rabbitmq);
  if (rabbitUrl !== undefined) {
    const { rabbitmq, rabbitmqSource } = await adapter(() => import('../brokers/rabbitmq/index.ts'), 'amqplib');
    const exchange = stringOption(values.exchange);
    const queue = stringOption(values.queue);
    const otherQueue = stringOption(values['check-queue']);
    if (exchange === undefined && queue === undefined) {
      throw new UsageError('mailroom doctor: --rabbitmq needs --exchange (the relay target) or --queue (a queue a mailroom consumer reads), or both');
    }
    if (otherQueue !== undefined && exchange === undefined) {
      throw new UsageError('mailroom doctor: --check-queue goes with --exchange', 'e.g. mailroom doctor --rabbitmq URL --exchange shop --check-queue invoices');
    }
    if (exchange !== undefined) {
      const target = rabbitmq({ url: rabbitUrl, exchange, declare: false, checkQueues: otherQueue === undefined ? [] : [otherQueue] });
      checks.push({ subject: `rabbitmq exchange ${exchange}`, fromConfig: false, run: () => target.check({ republishHorizonMs }), close: () => target.close() });
    }
    if (queue !== undefined) {
      const source = rabbitmqSource({ url: rabbitUrl, queue });
      checks.push({ subject: `rabbitmq queue ${queue}`, fromConfig: false, run: () => source.check(), close: () => source.stop() });
    }
  }
  const natsUrl = stringOption(values.nats);
  if (natsUrl !== undefined) {
    const { nats, natsSource } = await adapter(() => import('../brokers/nats/index.ts'), '@nats-io/transport-node @nats-io/jetstream');
    const stream = need(values, 'stream', '--nats URL');
    const target = nats({ url: natsUrl, stream, declare: false });
    checks.push({ subject: `nats stream ${stream}`, fromConfig: false, run: () => target.check({ republishHorizonMs }), close: () => target.close() });
    const durable = stringOption(values.durable);
    if (durable !== undefined) {
      const source = natsSource({ url: natsUrl, stream, durable });
      checks.push({ subject: `nats consumer ${durable}`, fromConfig: false, run: () => source.check(), close: () => source.stop() });
    }
  }
  const redisUrl = stringOption(values.redis);
  if (redisUrl !== undefined) {
    const { redisStreams } = await adapter(() => import('../brokers/redis/index.ts'), 'ioredis');
    const stream = need(values, 'redis-stream', '--redis URL');
    const target = redisStreams({ url: redisUrl, stream });
    checks.push({ subject: `redis stream ${stream}`, fromConfig: false, run: () => target.check?.({ republishHorizonMs }) ?? Promise.resolve([]), close: async () => target.close?.() });
  }
  return checks;
}

/** Whether a broker flag is given; a flag that goes with a broker flag given without it is a usage error. */
function brokerFlags(values: Record<string, string | boolean | undefined>): boolean {
  let any = false;
  for (const [broker, details] of Object.entries(BROKER_FLAGS)) {
    if (stringOption(values[broker]) !== undefined) any = true;
    else for (const detail of details) if (values[detail] !== undefined) throw new UsageError(`mailroom doctor: --${detail} goes with --${broker} URL`, `e.g. mailroom doctor --${broker} URL --${detail} NAME`);
  }
  if (!any && values.lease !== undefined) {
    throw new UsageError('mailroom doctor: --lease goes with --rabbitmq, --nats or --redis', "a config's relay targets are checked with the relay's own lease (relay.lease, default 30s)");
  }
  return any;
}

/** The `doctor` command. */
export const doctorCommand: CommandSpec = {
  name: 'doctor',
  summary: 'check brokers for settings that break the guarantees (changes nothing)',
  usage:
    'mailroom doctor [--config PATH] [--database URL | --data-dir DIR] [--schema NAME] [--rabbitmq URL [--exchange NAME [--check-queue NAME]] [--queue NAME]] [--nats URL --stream NAME [--durable NAME]] [--redis URL --redis-stream NAME] [--lease 30s] [--json]',
  options: {
    config: { type: 'string', value: 'PATH', description: "a config file whose relay targets and consumers' sources to check (default without broker flags: mailroom.config.* here)" },
    database: DATABASE_OPTIONS.database!,
    'data-dir': DATABASE_OPTIONS['data-dir']!,
    schema: DATABASE_OPTIONS.schema!,
    rabbitmq: { type: 'string', value: 'URL', description: 'a RabbitMQ server (amqp://…)' },
    exchange: { type: 'string', value: 'NAME', description: "the relay target's exchange" },
    queue: { type: 'string', value: 'NAME', description: "a queue a mailroom consumer reads (mailroom is its retry path: it needs no delivery limit)" },
    'check-queue': { type: 'string', value: 'NAME', description: 'a queue other services read from the exchange: warned about without a delivery limit or a dead-letter exchange' },
    nats: { type: 'string', value: 'URL', description: 'a NATS server (nats://…)' },
    stream: { type: 'string', value: 'NAME', description: 'the JetStream stream' },
    durable: { type: 'string', value: 'NAME', description: "a consumer group's durable consumer" },
    redis: { type: 'string', value: 'URL', description: 'a Redis server (redis://…)' },
    'redis-stream': { type: 'string', value: 'NAME', description: 'the Redis stream' },
    lease: { type: 'string', value: 'DURATION', description: "for the brokers named by flags: the relay's lease (default 30s), which with its backoff says how late a republish can come" },
  },
  details:
    'Runs the adapters\' checks (docs/BROKERS.md, "Safety checks"): a Redis that keeps nothing on disk,\n' +
    'a JetStream duplicate window shorter than a republish can come, a missing exchange or stream, a\n' +
    'queue other services read with neither a delivery limit nor a dead-letter exchange, and more.\n' +
    'With --config, or with no broker flags and a mailroom.config.* here, it also checks every relay\n' +
    "target of the config's relay (with the horizon of relay.lease) and every consumer's broker\n" +
    'source (with its group and timeout), as `mailroom start` would at start; each finding names its\n' +
    'entry. A config without brokers is reported as nothing to check (exit 0).\n' +
    "With --database, --data-dir or --schema, a config's database, or DATABASE_URL, it checks mailroom's\n" +
    'schema there too: every migration applied, every index of sql/schema.sql present and valid;\n' +
    'and that no synchronous standby the server waits for at each COMMIT is missing.\n' +
    'Declares nothing. Exit 0 when nothing was found, 1 when something was (or could not be checked),\n' +
    '2 for a usage mistake or a config that does not load.',
  async run(values, io) {
    const flagged = brokerFlags(values);
    const leaseMs = toMilliseconds(stringOption(values.lease) ?? '30s', 'doctor --lease');
    const checks = await checksFor(values, republishHorizonOf(leaseMs));
    // With broker flags, a config is read only when --config names it.
    const loaded = !flagged || values.config !== undefined ? await loadCommandConfig(values, false) : undefined;
    const database = databaseCheck(values, loaded?.config);
    if (database) checks.push(database);
    if (loaded === undefined && checks.length === 0) {
      throw new UsageError(
        'mailroom doctor: name at least one broker or a database to check, or a config file with --config (none of mailroom.config.* is here)',
        'e.g. mailroom doctor --config mailroom.config.ts, or mailroom doctor --redis redis://127.0.0.1:6379 --redis-stream orders',
      );
    }
    if (loaded) checks.push(...configChecks(loaded.config));
    const found: { warning: SafetyWarning; check: Check }[] = [];
    const failures: { subject: string; message: string }[] = [];
    for (const check of checks) {
      try {
        for (const warning of (await check.run?.()) ?? []) found.push({ warning, check });
      } catch (error) {
        failures.push({ subject: check.subject, message: error instanceof Error ? error.message : String(error) });
      } finally {
        await check.close().catch(() => undefined);
      }
    }
    const checked = checks.filter((c) => c.run !== null).map((c) => c.subject);
    const unchecked = checks.filter((c) => c.run === null).map((c) => c.subject);
    const note = loaded && database === undefined && !checks.some((c) => c.fromConfig && c.run !== null) ? nothingToCheck(loaded.display, unchecked) : undefined;
    const ok = found.length === 0 && failures.length === 0;
    if (values.json) {
      const warnings = found.map(({ warning, check }) => ({ ...warning, check: check.subject }));
      io.out.write(`${JSON.stringify({ ok, config: loaded?.display ?? null, checked, unchecked, warnings, failures, ...(note ? { note } : {}) })}\n`);
      return ok ? 0 : 1;
    }
    if (loaded) io.out.write(`config: ${loaded.display}\n`);
    for (const { warning: w, check } of found) io.out.write(`warning ${w.code}: ${w.subject}${check.fromConfig ? ` (${check.subject})` : ''}\n  ${w.message}\n`);
    for (const f of failures) io.out.write(`could not check ${f.subject}: ${f.message}\n`);
    if (note) io.out.write(`${note}\n`);
    else if (unchecked.length > 0) io.out.write(`no check() to run: ${unchecked.join(', ')}\n`);
    if (!ok) io.out.write(`${found.length} warning(s), ${failures.length} check(s) that could not run.\n`);
    else if (checked.length > 0) io.out.write(`No problems found (${checked.join(', ')}).\n`);
    return ok ? 0 : 1;
  },
};

/** Says that a config names no broker to check (and which of its entries have no check()). */
function nothingToCheck(display: string, unchecked: string[]): string {
  const without = unchecked.length > 0 ? `; ${unchecked.join(', ')} ha${unchecked.length === 1 ? 's' : 've'} no check()` : '';
  return `Nothing to check in ${display}: no relay target or consumer source on a broker${without}.`;
}
