/**
 * The RabbitMQ side of the shared broker adapter suite: each pair is a durable
 * topic exchange and a quorum queue bound to it with `#`, on the server at
 * RABBITMQ_URL. A restart is `rabbitmqctl stop_app` + `start_app` of that
 * server (so keep restarts few: each costs seconds).
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { connect, type ChannelModel } from 'amqplib';
import { rabbitmq, rabbitmqSource } from '../../../src/brokers/rabbitmq/index.ts';
import type { ConsumerSource } from '../../../src/brokers/source.ts';
import type { BrokerFixture, BrokerPair, PairDescription, RawPublisher } from './fixture.ts';

const run = promisify(execFile);
const url = process.env.RABBITMQ_URL ?? null;

function requireUrl(): string {
  if (url === null) throw new Error('set RABBITMQ_URL (e.g. amqp://guest:guest@127.0.0.1:5672) to run the RabbitMQ tests');
  return url;
}

/** Runs `fn` on a fresh connection and closes it. */
export async function withConnection<T>(fn: (connection: ChannelModel) => Promise<T>, brokerUrl = requireUrl()): Promise<T> {
  const connection = await connect(brokerUrl);
  connection.on('error', () => {});
  try {
    return await fn(connection);
  } finally {
    await connection.close().catch(() => {});
  }
}

/** Resolves once a connection to the broker succeeds (polling every 100 ms), or fails after `timeoutMs`. */
export async function waitForBroker(brokerUrl = requireUrl(), timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const connection = await connect(brokerUrl, { timeout: 2000 });
      connection.on('error', () => {});
      await connection.close().catch(() => {});
      return;
    } catch (error) {
      if (Date.now() > deadline) throw new Error(`RabbitMQ at ${brokerUrl} did not accept connections within ${timeoutMs} ms`, { cause: error });
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

/** `rabbitmqctl stop_app`: the node stays up, AMQP connections close and new ones are refused. */
export async function stopApp(): Promise<void> {
  await run('rabbitmqctl', ['stop_app'], { timeout: 60_000 });
}

/** `rabbitmqctl start_app`, then waits until a connection succeeds. */
export async function startApp(brokerUrl = requireUrl()): Promise<void> {
  await run('rabbitmqctl', ['start_app'], { timeout: 60_000 });
  await waitForBroker(brokerUrl);
}

/**
 * Sets the server's `max_message_size` (bytes; RabbitMQ 3.10's default is 128 MiB) for channels
 * opened from now on. Restore it when done: it applies to every client of the server.
 */
export async function setMaxMessageSize(bytes: number): Promise<void> {
  if (!Number.isInteger(bytes) || bytes <= 0) throw new Error(`max_message_size must be a positive integer, got ${bytes}`);
  await run('rabbitmqctl', ['eval', `application:set_env(rabbit, max_message_size, ${bytes}).`], { timeout: 60_000 });
}

/** RabbitMQ 3.10's default `max_message_size`. */
export const DEFAULT_MAX_MESSAGE_SIZE = 134_217_728;

/** Stops and starts the RabbitMQ application; resolves with how long it took, once connections succeed again. */
export async function restartBroker(brokerUrl = requireUrl()): Promise<{ stopMs: number; startMs: number }> {
  const t0 = Date.now();
  await stopApp();
  const t1 = Date.now();
  await startApp(brokerUrl);
  return { stopMs: t1 - t0, startMs: Date.now() - t1 };
}

/** Declares the pair's exchange and queue (idempotent). */
async function declarePair(brokerUrl: string, exchange: string, queue: string): Promise<void> {
  await withConnection(async (connection) => {
    const channel = await connection.createChannel();
    await channel.assertExchange(exchange, 'topic', { durable: true });
    await channel.assertQueue(queue, { durable: true, arguments: { 'x-queue-type': 'quorum' } });
    await channel.bindQueue(queue, exchange, '#');
    await channel.close();
  }, brokerUrl);
}

function makeSource(description: PairDescription, options?: { prefetch?: number }): ConsumerSource {
  const { url: brokerUrl, queue, exchange } = description;
  if (typeof brokerUrl !== 'string' || typeof queue !== 'string' || typeof exchange !== 'string') {
    throw new Error(`not a RabbitMQ pair description: ${JSON.stringify(description)}`);
  }
  return rabbitmqSource({ url: brokerUrl, queue, ...(options?.prefetch === undefined ? {} : { prefetch: options.prefetch }), declare: { exchange, type: 'quorum' } });
}

async function rawPublisher(brokerUrl: string, exchange: string): Promise<RawPublisher> {
  const connection = await connect(brokerUrl);
  connection.on('error', () => {});
  const channel = await connection.createConfirmChannel();
  channel.on('error', () => {});
  return {
    async publish(body, options) {
      const content = typeof body === 'string' ? Buffer.from(body, 'utf8') : body;
      await new Promise<void>((resolve, reject) => {
        channel.publish(exchange, 'raw', content, { persistent: true, messageId: options?.messageId, headers: options?.headers ?? {} }, (err: unknown) =>
          err ? reject(err instanceof Error ? err : new Error(String(err))) : resolve(),
        );
      });
    },
    async close() {
      await connection.close().catch(() => {});
    },
  };
}

export const fixture: BrokerFixture = {
  kind: 'rabbitmq',
  url,
  async pair(unique: string): Promise<BrokerPair> {
    const brokerUrl = requireUrl();
    const exchange = `mailroom-test-${unique}`;
    const queue = `mailroom-test-${unique}`;
    await declarePair(brokerUrl, exchange, queue);
    const description: PairDescription = { url: brokerUrl, exchange, queue };
    return {
      target: () => rabbitmq({ url: brokerUrl, exchange, confirmTimeout: '10s' }),
      source: (options) => makeSource(description, options),
      raw: () => rawPublisher(brokerUrl, exchange),
      async pending() {
        // With no consumer, every delivered-unacked message is back among the ready ones;
        // the broker requeues them as the consumer's channel goes away, so read until two reads agree.
        return await withConnection(async (connection) => {
          const channel = await connection.createChannel();
          let last = (await channel.checkQueue(queue)).messageCount;
          for (let i = 0; i < 50; i++) {
            await new Promise((r) => setTimeout(r, 50));
            const now = (await channel.checkQueue(queue)).messageCount;
            if (now === last) break;
            last = now;
          }
          await channel.close();
          return last;
        }, brokerUrl);
      },
      async restart() {
        await restartBroker(brokerUrl);
      },
      describe: () => ({ ...description }),
      async cleanup() {
        await withConnection(async (connection) => {
          const channel = await connection.createChannel();
          await channel.deleteQueue(queue);
          await channel.deleteExchange(exchange);
          await channel.close();
        }, brokerUrl);
      },
    };
  },
  sourceFrom: (description, options) => makeSource(description, options),
};
