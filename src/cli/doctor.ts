/**
 * `mailroom doctor`: checks the brokers named on the command line for
 * settings that break mailroom's guarantees (the adapters' own checks, the
 * same ones the relay and consumers run at start), without changing anything.
 * Exit 0: nothing found; 1: warnings (or a broker could not be checked).
 */
import { toMilliseconds } from '../duration.ts';
import type { SafetyWarning } from '../brokers/safety.ts';
import { republishHorizonMs as republishHorizonOf } from '../relay/relay.ts';
import { stringOption, UsageError, type CommandSpec } from './args.ts';


interface Check {
  subject: string;
  run(): Promise<SafetyWarning[]>;
  close(): Promise<void>;
}

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
    if (exchange === undefined && queue === undefined) throw new UsageError('mailroom doctor: --rabbitmq needs --exchange (the relay target) or --queue (a consumer source), or both');
    if (exchange !== undefined) {
      const target = rabbitmq({ url: rabbitUrl, exchange, declare: false, checkQueues: queue === undefined ? [] : [queue] });
      checks.push({ subject: `rabbitmq exchange ${exchange}`, run: () => target.check({ republishHorizonMs }), close: () => target.close() });
    }
    if (queue !== undefined) {
      const source = rabbitmqSource({ url: rabbitUrl, queue });
      checks.push({ subject: `rabbitmq queue ${queue}`, run: () => source.check(), close: () => source.stop() });
    }
  }
  const natsUrl = stringOption(values.nats);
  if (natsUrl !== undefined) {
    const { nats, natsSource } = await adapter(() => import('../brokers/nats/index.ts'), '@nats-io/transport-node @nats-io/jetstream');
    const stream = need(values, 'stream', '--nats URL');
    const target = nats({ url: natsUrl, stream, declare: false });
    checks.push({ subject: `nats stream ${stream}`, run: () => target.check({ republishHorizonMs }), close: () => target.close() });
    const durable = stringOption(values.durable);
    if (durable !== undefined) {
      const source = natsSource({ url: natsUrl, stream, durable });
      checks.push({ subject: `nats consumer ${durable}`, run: () => source.check(), close: () => source.stop() });
    }
  }
  const redisUrl = stringOption(values.redis);
  if (redisUrl !== undefined) {
    const { redisStreams } = await adapter(() => import('../brokers/redis/index.ts'), 'ioredis');
    const stream = need(values, 'redis-stream', '--redis URL');
    const target = redisStreams({ url: redisUrl, stream });
    checks.push({ subject: `redis stream ${stream}`, run: () => target.check?.({ republishHorizonMs }) ?? Promise.resolve([]), close: async () => target.close?.() });
  }
  return checks;
}

/** The `doctor` command. */
export const doctorCommand: CommandSpec = {
  name: 'doctor',
  summary: 'check brokers for settings that break the guarantees (changes nothing)',
  usage:
    'mailroom doctor [--rabbitmq URL [--exchange NAME] [--queue NAME]] [--nats URL --stream NAME [--durable NAME]] [--redis URL --redis-stream NAME] [--lease 30s] [--json]',
  options: {
    rabbitmq: { type: 'string', value: 'URL', description: 'a RabbitMQ server (amqp://…)' },
    exchange: { type: 'string', value: 'NAME', description: "the relay target's exchange" },
    queue: { type: 'string', value: 'NAME', description: 'a queue a consumer reads, or that other services read from the exchange' },
    nats: { type: 'string', value: 'URL', description: 'a NATS server (nats://…)' },
    stream: { type: 'string', value: 'NAME', description: 'the JetStream stream' },
    durable: { type: 'string', value: 'NAME', description: "a consumer group's durable consumer" },
    redis: { type: 'string', value: 'URL', description: 'a Redis server (redis://…)' },
    'redis-stream': { type: 'string', value: 'NAME', description: 'the Redis stream' },
    lease: { type: 'string', value: 'DURATION', description: "the relay's lease (default 30s): with its backoff, how late a republish can come" },
  },
  details:
    'Runs the adapters\' checks (docs/BROKERS.md, "Safety checks"): a Redis that keeps nothing on disk,\n' +
    'a JetStream duplicate window shorter than a republish can come, a missing exchange or stream, a\n' +
    'queue other services read with neither a delivery limit nor a dead-letter exchange, and more.\n' +
    'Declares nothing. Exit 0 when nothing was found, 1 when something was (or could not be checked).',
  async run(values, io) {
    const leaseMs = toMilliseconds(stringOption(values.lease) ?? '30s', 'doctor --lease');
    const checks = await checksFor(values, republishHorizonOf(leaseMs));
    if (checks.length === 0) {
      throw new UsageError('mailroom doctor: name at least one broker to check', 'e.g. mailroom doctor --redis redis://127.0.0.1:6379 --redis-stream orders');
    }
    const warnings: SafetyWarning[] = [];
    const failures: { subject: string; message: string }[] = [];
    for (const check of checks) {
      try {
        warnings.push(...(await check.run()));
      } catch (error) {
        failures.push({ subject: check.subject, message: error instanceof Error ? error.message : String(error) });
      } finally {
        await check.close().catch(() => undefined);
      }
    }
    const ok = warnings.length === 0 && failures.length === 0;
    if (values.json) {
      io.out.write(`${JSON.stringify({ ok, checked: checks.map((c) => c.subject), warnings, failures })}\n`);
    } else {
      for (const w of warnings) io.out.write(`warning ${w.code}: ${w.subject}\n  ${w.message}\n`);
      for (const f of failures) io.out.write(`could not check ${f.subject}: ${f.message}\n`);
      if (ok) io.out.write(`No problems found (${checks.map((c) => c.subject).join(', ')}).\n`);
      else io.out.write(`${warnings.length} warning(s), ${failures.length} check(s) that could not run.\n`);
    }
    return ok ? 0 : 1;
  },
};
