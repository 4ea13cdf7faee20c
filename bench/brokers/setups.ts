/**
 * What the broker benchmarks need per broker: a target, a source, a
 * destination made ready and removed, and the broker's own ceiling with the
 * relay's messages. Used by main.ts, relay-alone.ts, lag-probe.ts and
 * ingest-alone.ts. SOURCE_PREFETCH sets the sources' prefetch (default 500).
 */
import { connect as amqpConnect, type Channel } from 'amqplib';
import type { JetStreamManager } from '@nats-io/jetstream';
import type { Redis } from 'ioredis';
import { defineEvent, toEnvelope, toWireMessage, type ConsumerSource, type RelayTarget } from '../../dist/index.js';
import { rabbitmq, rabbitmqSource } from '../../dist/brokers/rabbitmq/index.js';
import { nats, natsSource } from '../../dist/brokers/nats/index.js';
import { redisSource, redisStreams } from '../../dist/brokers/redis/index.js';
import { ceiling as rabbitmqCeiling } from './rabbitmq-ceiling.ts';
import { ceiling as natsCeiling } from './nats-ceiling.ts';
import { ceiling as redisCeiling } from './redis-ceiling.ts';

export type Kind = 'rabbitmq' | 'nats' | 'redis';

/** What a broker needs for a run: a target, a source for a group, and a destination made ready. */
export interface BrokerSetup {
  target(name: string): RelayTarget;
  source(name: string): ConsumerSource;
  /** Makes the destination keep what is published (RabbitMQ: a queue bound to the exchange). */
  prepare(name: string): Promise<void>;
  cleanup(name: string): Promise<void>;
  /** How many messages the destination holds (a check that the relay's rate counted messages that arrived). */
  held(name: string): Promise<number>;
  ceiling(messages: number): Promise<{ perSecond: number }>;
}

export const noted = defineEvent<{ n: number; pad: string }>('bench.item-noted', { version: 1 });
export const PAD = 'x'.repeat(120); // a body of about 450 bytes, like a small real event

/** The ceiling publishes messages of the relay's size with its transport headers (the bench's events have a key). */
const SAME_MESSAGES = (() => {
  const envelope = toEnvelope({
    position: '1', xid: '1', id: '01936f8e-1f2a-7000-8000-000000000001', type: noted.type, version: 1, source: 'mailroom://bench-host',
    subject: 'k42', time: new Date(), correlation_id: null, causation_id: null, traceparent: null, headers: null, data: { n: 12345, pad: PAD },
  });
  const wire = toWireMessage(envelope);
  return { bodyBytes: wire.body.byteLength, headers: { ...wire.headers } };
})();

/** The brokers' URLs: RABBITMQ_URL, NATS_URL and REDIS_URL, else this machine's servers on their standard ports. */
export function brokerUrls(): Record<Kind, string> {
  return {
    rabbitmq: process.env.RABBITMQ_URL ?? 'amqp://guest:guest@127.0.0.1:5672',
    nats: process.env.NATS_URL ?? 'nats://127.0.0.1:4222',
    redis: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379',
  };
}

/** Throws unless the destination holds exactly `expected` messages after a run. */
export async function checkHeld(setup: BrokerSetup, name: string, expected: number): Promise<void> {
  const held = await setup.held(name);
  if (held !== expected) throw new Error(`the broker holds ${held} messages after the run, expected ${expected}: the rate would count messages that did not arrive (or arrived twice)`);
}

/** Runs `fn` on a channel of a fresh AMQP connection, closed after. */
async function withChannel<T>(url: string, fn: (channel: Channel) => Promise<T>): Promise<T> {
  const c = await amqpConnect(url);
  try {
    return await fn(await c.createChannel());
  } finally {
    await c.close();
  }
}

/** Runs `fn` with a JetStream manager on a fresh NATS connection, closed after. */
async function withStreams<T>(url: string, fn: (jsm: JetStreamManager) => Promise<T>): Promise<T> {
  const { connect } = await import('@nats-io/transport-node');
  const { jetstreamManager } = await import('@nats-io/jetstream');
  const nc = await connect({ servers: url });
  try {
    return await fn(await jetstreamManager(nc));
  } finally {
    await nc.close();
  }
}

/** Runs `fn` with a fresh Redis client, disconnected after. */
async function withRedis<T>(url: string, fn: (redis: Redis) => Promise<T>): Promise<T> {
  const { Redis } = await import('ioredis');
  const r = new Redis(url);
  try {
    return await fn(r);
  } finally {
    r.disconnect();
  }
}

export function setups(urls: Record<Kind, string>): Record<Kind, BrokerSetup> {
  return {
    rabbitmq: {
      target: (name) => rabbitmq({ url: urls.rabbitmq, exchange: name }),
      source: (name) => rabbitmqSource({ url: urls.rabbitmq, queue: name, prefetch: Number(process.env.SOURCE_PREFETCH ?? 500), declare: { exchange: name, bindingKeys: ['#'] } }),
      prepare: (name) =>
        withChannel(urls.rabbitmq, async (ch) => {
          await ch.assertExchange(name, 'topic', { durable: true });
          await ch.assertQueue(name, { durable: true, arguments: { 'x-queue-type': 'quorum' } });
          await ch.bindQueue(name, name, '#');
        }),
      cleanup: (name) =>
        withChannel(urls.rabbitmq, async (ch) => {
          await ch.deleteQueue(name);
          await ch.deleteExchange(name);
        }),
      held: (name) => withChannel(urls.rabbitmq, async (ch) => (await ch.checkQueue(name)).messageCount),
      ceiling: (messages) => rabbitmqCeiling({ url: urls.rabbitmq, messages, ...SAME_MESSAGES }),
    },
    nats: {
      target: (name) => nats({ url: urls.nats, stream: name }),
      source: (name) => natsSource({ url: urls.nats, stream: name, prefetch: Number(process.env.SOURCE_PREFETCH ?? 500), from: 'earliest' }),
      // The stream as the target declares it, made before a consumer looks for it.
      prepare: (name) => withStreams(urls.nats, async (jsm) => void (await jsm.streams.add({ name, subjects: [`${name}.>`], duplicate_window: 120_000_000_000 }).catch(() => undefined))),
      cleanup: (name) => withStreams(urls.nats, async (jsm) => void (await jsm.streams.delete(name).catch(() => false))),
      held: (name) => withStreams(urls.nats, async (jsm) => (await jsm.streams.info(name)).state.messages),
      ceiling: (messages) => natsCeiling({ url: urls.nats, messages, ...SAME_MESSAGES }),
    },
    redis: {
      target: (name) => redisStreams({ url: urls.redis, stream: name }),
      source: (name) => redisSource({ url: urls.redis, stream: name, prefetch: Number(process.env.SOURCE_PREFETCH ?? 500), from: 'earliest' }),
      async prepare() {},
      cleanup: (name) =>
        withRedis(urls.redis, async (r) => {
          const keys = await r.keys(`*${name}*`);
          // In slices: a run of 200,000 events leaves as many dedup keys, too many arguments for one call.
          for (let i = 0; i < keys.length; i += 1000) await r.del(...keys.slice(i, i + 1000));
        }),
      held: (name) => withRedis(urls.redis, (r) => r.xlen(name)),
      ceiling: (messages) => redisCeiling({ url: urls.redis, messages, ...SAME_MESSAGES }),
    },
  };
}

