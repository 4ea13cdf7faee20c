/**
 * The RabbitMQ side of the shared broker adapter suite: each pair is a durable
 * topic exchange and a quorum queue bound to it with `#`, on the server at
 * RABBITMQ_URL, or (restartable pairs) on a private node of their own, which
 * `restart()` stops and starts (`rabbitmqctl stop_app` + `start_app`). The
 * shared server is never stopped: other test files use it at the same time.
 */
import { connect, type ChannelModel } from 'amqplib';
import { rabbitmq, rabbitmqSource } from '../../../src/brokers/rabbitmq/index.ts';
import type { ConsumerSource } from '../../../src/brokers/source.ts';
import type { BrokerFixture, BrokerPair, PairDescription, RawPublisher } from './fixture.ts';
import { PrivateRabbitNode } from './private-rabbitmq.ts';

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

/** A pair with its private node, if it is restartable (null on RABBITMQ_URL). */
export interface RabbitPair extends BrokerPair {
  readonly node: PrivateRabbitNode | null;
}

/** `fixture.pair()` with the RabbitMQ specifics visible. */
export async function rabbitPair(unique: string, options: { restartable?: boolean } = {}): Promise<RabbitPair> {
  const node = options.restartable ? await PrivateRabbitNode.start() : null;
  const brokerUrl = node?.url ?? requireUrl();
  const exchange = `mailroom-test-${unique}`;
  const queue = `mailroom-test-${unique}`;
  try {
    await declarePair(brokerUrl, exchange, queue);
  } catch (error) {
    await node?.stop();
    throw error;
  }
  const description: PairDescription = { url: brokerUrl, exchange, queue };
  return {
    node,
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
      if (node === null) throw new Error('only a pair made with { restartable: true } may restart its broker');
      await node.restartApp();
    },
    describe: () => ({ ...description }),
    async cleanup() {
      if (node !== null) return await node.stop();
      await withConnection(async (connection) => {
        const channel = await connection.createChannel();
        await channel.deleteQueue(queue);
        await channel.deleteExchange(exchange);
        await channel.close();
      }, brokerUrl);
    },
  };
}

export const fixture: BrokerFixture = {
  kind: 'rabbitmq',
  url,
  pair: rabbitPair,
  sourceFrom: (description, options) => makeSource(description, options),
};
