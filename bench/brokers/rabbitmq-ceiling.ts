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
import { timeBatches, type CeilingOptions, type CeilingResult } from './ceiling-common.ts';

export interface RabbitMqCeilingOptions extends CeilingOptions {
  /** The queue's type. Default `'quorum'`. */
  queueType?: 'quorum' | 'classic';
}

export async function ceiling(options: RabbitMqCeilingOptions): Promise<CeilingResult> {
  const { url, messages } = options;
  const bodyBytes = options.bodyBytes ?? 300;
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
      return await timeBatches(messages, async (n) => {
        const confirms: Promise<void>[] = [];
        for (let i = 0; i < n; i++) {
          confirms.push(
            new Promise<void>((resolve, reject) => {
              const properties = {
                persistent: true,
                mandatory: true,
                messageId: randomUUID(),
                contentType: 'application/cloudevents+json; charset=utf-8',
                type: 'ceiling.measured',
                timestamp: Math.floor(Date.now() / 1000),
                headers: { ...options.headers },
              };
              channel.publish(name, 'ceiling.measured', body, properties, (err: unknown) => (err ? reject(err instanceof Error ? err : new Error(String(err))) : resolve()));
            }),
          );
        }
        await Promise.all(confirms);
      });
    } finally {
      await channel.deleteQueue(name);
      await channel.deleteExchange(name);
      await channel.close();
    }
  } finally {
    await connection.close().catch(() => {});
  }
}
