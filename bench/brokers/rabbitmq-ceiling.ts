/**
 * RabbitMQ's own ceiling for what the relay does, with no database: a bare
 * amqplib client on a confirm channel publishing persistent messages of about
 * `bodyBytes` to a durable topic exchange with one durable queue bound (a
 * quorum queue, as mailroom's source declares by default), in batches of 100:
 * publish the batch, then wait for all its confirms. Creates and deletes its
 * own exchange and queue.
 *
 *   npx tsx -e "import('./bench/brokers/rabbitmq-ceiling.ts').then(async (m) => console.log(await m.ceiling({ url: 'amqp://guest:guest@127.0.0.1:5672', messages: 100000 })))"
 */
import { randomUUID } from 'node:crypto';
import { connect } from 'amqplib';
import { now } from '../stats.ts';

export interface RabbitMqCeilingOptions {
  url: string;
  messages: number;
  /** Body size in bytes. Default 300 (about a small CloudEvents document). */
  bodyBytes?: number;
  /** Transport headers on every message (as the relay sends: `partitionkey`, `traceparent`, …). Default none. */
  headers?: Record<string, string>;
  /** The queue's type. Default `'quorum'`. */
  queueType?: 'quorum' | 'classic';
}

export interface CeilingResult {
  perSecond: number;
  messages: number;
  seconds: number;
}

const BATCH = 100;

export async function ceiling(options: RabbitMqCeilingOptions): Promise<CeilingResult> {
  const { url, messages } = options;
  const bodyBytes = options.bodyBytes ?? 300;
  if (!Number.isInteger(messages) || messages < 1) throw new Error(`ceiling: messages must be a positive integer, got ${messages}`);
  const name = `mailroom-ceiling-${process.pid}-${randomUUID().slice(0, 8)}`;
  const connection = await connect(url);
  connection.on('error', () => {});
  try {
    const channel = await connection.createConfirmChannel();
    await channel.assertExchange(name, 'topic', { durable: true });
    await channel.assertQueue(name, { durable: true, arguments: { 'x-queue-type': options.queueType ?? 'quorum' } });
    await channel.bindQueue(name, name, '#');
    try {
      const body = Buffer.alloc(bodyBytes, 'x');
      const started = now();
      for (let sent = 0; sent < messages; ) {
        const n = Math.min(BATCH, messages - sent);
        const confirms: Promise<void>[] = [];
        for (let i = 0; i < n; i++) {
          confirms.push(
            new Promise<void>((resolve, reject) => {
              channel.publish(name, 'ceiling.measured', body, {
                  persistent: true,
                  mandatory: true,
                  messageId: randomUUID(),
                  contentType: 'application/cloudevents+json; charset=utf-8',
                  type: 'ceiling.measured',
                  timestamp: Math.floor(Date.now() / 1000),
                  headers: { ...options.headers },
                }, (err: unknown) =>
                err ? reject(err instanceof Error ? err : new Error(String(err))) : resolve(),
              );
            }),
          );
        }
        await Promise.all(confirms);
        sent += n;
      }
      const seconds = (now() - started) / 1000;
      return { perSecond: messages / seconds, messages, seconds };
    } finally {
      await channel.deleteQueue(name);
      await channel.deleteExchange(name);
      await channel.close();
    }
  } finally {
    await connection.close().catch(() => {});
  }
}
