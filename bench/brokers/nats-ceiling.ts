/**
 * NATS JetStream's own ceiling for what the relay does, with no database: a
 * bare client publishing messages of about `bodyBytes` to a file-storage
 * stream, each with a `Nats-Msg-Id` (the stream deduplicates on it, as for the
 * relay), in batches of 100: publish the batch, then wait for all its PubAcks.
 * Measured two ways, and the faster one is the ceiling: with the client's
 * `js.publish()` (a request per message), and as plain publishes whose reply
 * subject is an inbox of the client's own, one subscription collecting the
 * PubAcks (how the relay's target publishes since session 7; the client's
 * per-request objects, timers and errors are then not paid). Creates and
 * deletes its own stream.
 *
 *   npx tsx -e "import('./bench/brokers/nats-ceiling.ts').then(async (m) => console.log(await m.ceiling({ url: 'nats://127.0.0.1:4222', messages: 100000 })))"
 */
import { randomUUID } from 'node:crypto';
import { jetstream, jetstreamManager, StorageType } from '@nats-io/jetstream';
import { connect, createInbox, headers, type MsgHdrs } from '@nats-io/transport-node';
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
      const messageHeaders = (): MsgHdrs => {
        const h = headers();
        h.set('content-type', 'application/cloudevents+json; charset=utf-8');
        for (const [k, v] of Object.entries(options.headers ?? {})) h.set(k, v);
        return h;
      };
      const requests = await timeBatches(messages, async (n) => {
        const acks = [];
        for (let i = 0; i < n; i++) acks.push(js.publish(subject, body, { msgID: randomUUID(), headers: messageHeaders(), expect: { streamName: name } }));
        await Promise.all(acks);
      });
      const inbox = createInbox();
      const waiting = new Map<number, { resolve: () => void; reject: (e: Error) => void }>();
      const subscription = nc.subscribe(`${inbox}.*`, {
        callback: (_err, msg) => {
          const n = Number(msg.subject.slice(inbox.length + 1));
          const ack = msg.headers?.hasError ? { error: msg.headers.description } : msg.json<{ error?: unknown }>();
          if (ack.error === undefined) waiting.get(n)?.resolve();
          else waiting.get(n)?.reject(new Error(`ceiling: PubAck error ${JSON.stringify(ack.error)}`));
          waiting.delete(n);
        },
      });
      let next = 0;
      const inboxed = await timeBatches(messages, async (n) => {
        const acks: Promise<void>[] = [];
        for (let i = 0; i < n; i++) {
          const h = messageHeaders();
          h.set('Nats-Msg-Id', randomUUID());
          h.set('Nats-Expected-Stream', name);
          const number = next++;
          acks.push(new Promise<void>((resolve, reject) => waiting.set(number, { resolve, reject })));
          nc.publish(subject, body, { headers: h, reply: `${inbox}.${number}` });
        }
        await Promise.all(acks);
      });
      subscription.unsubscribe();
      return inboxed.perSecond > requests.perSecond ? inboxed : requests;
    } finally {
      await jsm.streams.delete(name);
    }
  } finally {
    await nc.close();
  }
}
