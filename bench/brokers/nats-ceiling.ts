/**
 * NATS JetStream's own ceiling for what the relay does, with no database: a
 * bare client publishing messages of about `bodyBytes` to a file-storage
 * stream, each with a `Nats-Msg-Id` (the stream deduplicates on it, as for the
 * relay), in batches of 100: publish the batch, then wait for all its PubAcks.
 * Creates and deletes its own stream.
 *
 *   npx tsx -e "import('./bench/brokers/nats-ceiling.ts').then(async (m) => console.log(await m.ceiling({ url: 'nats://127.0.0.1:4222', messages: 100000 })))"
 */
import { randomUUID } from 'node:crypto';
import { jetstream, jetstreamManager, StorageType } from '@nats-io/jetstream';
import { connect, headers } from '@nats-io/transport-node';
import { timeBatches, type CeilingOptions, type CeilingResult } from './ceiling-common.ts';

export type NatsCeilingOptions = CeilingOptions;

export async function ceiling(options: NatsCeilingOptions): Promise<CeilingResult> {
  const { url, messages } = options;
  const bodyBytes = options.bodyBytes ?? 300;
  const name = `mailroom-ceiling-${process.pid}-${randomUUID().slice(0, 8)}`;
  const nc = await connect({ servers: url, noAsyncTraces: true }); // the client at its fastest, as the target runs it
  try {
    const jsm = await jetstreamManager(nc);
    await jsm.streams.add({ name, subjects: [`${name}.>`], storage: StorageType.File });
    try {
      const js = jetstream(nc);
      const body = Buffer.alloc(bodyBytes, 'x');
      const subject = `${name}.ceiling.measured`;
      return await timeBatches(messages, async (n) => {
        const acks = [];
        for (let i = 0; i < n; i++) {
          const h = headers();
          h.set('content-type', 'application/cloudevents+json; charset=utf-8');
          for (const [k, v] of Object.entries(options.headers ?? {})) h.set(k, v);
          acks.push(js.publish(subject, body, { msgID: randomUUID(), headers: h, expect: { streamName: name } }));
        }
        await Promise.all(acks);
      });
    } finally {
      await jsm.streams.delete(name);
    }
  } finally {
    await nc.close();
  }
}
