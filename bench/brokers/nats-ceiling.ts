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
import { now } from '../stats.ts';

export interface NatsCeilingOptions {
  url: string;
  messages: number;
  /** Body size in bytes. Default 300 (about a small CloudEvents document). */
  bodyBytes?: number;
  /** Transport headers on every message (as the relay sends: `partitionkey`, `traceparent`, …). Default none. */
  headers?: Record<string, string>;
}

export interface CeilingResult {
  perSecond: number;
  messages: number;
  seconds: number;
}

const BATCH = 100;

export async function ceiling(options: NatsCeilingOptions): Promise<CeilingResult> {
  const { url, messages } = options;
  const bodyBytes = options.bodyBytes ?? 300;
  if (!Number.isInteger(messages) || messages < 1) throw new Error(`ceiling: messages must be a positive integer, got ${messages}`);
  const name = `mailroom-ceiling-${process.pid}-${randomUUID().slice(0, 8)}`;
  const nc = await connect({ servers: url, noAsyncTraces: true }); // the client at its fastest, as the target runs it
  try {
    const jsm = await jetstreamManager(nc);
    await jsm.streams.add({ name, subjects: [`${name}.>`], storage: StorageType.File });
    try {
      const js = jetstream(nc);
      const body = Buffer.alloc(bodyBytes, 'x');
      const subject = `${name}.ceiling.measured`;
      const started = now();
      for (let sent = 0; sent < messages; ) {
        const n = Math.min(BATCH, messages - sent);
        const acks = [];
        for (let i = 0; i < n; i++) {
          const h = headers();
          h.set('content-type', 'application/cloudevents+json; charset=utf-8');
          for (const [k, v] of Object.entries(options.headers ?? {})) h.set(k, v);
          acks.push(js.publish(subject, body, { msgID: randomUUID(), headers: h, expect: { streamName: name } }));
        }
        await Promise.all(acks);
        sent += n;
      }
      const seconds = (now() - started) / 1000;
      return { perSecond: messages / seconds, messages, seconds };
    } finally {
      await jsm.streams.delete(name);
    }
  } finally {
    await nc.close();
  }
}
