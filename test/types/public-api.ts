/**
 * Compile-time checks of the public API's types (run by `npm run typecheck`,
 * part of `npm test`): the README's shapes must type-check, and misuse must not.
 */
import { z } from 'zod';
import { createMailroom, defineEvent, defineJob, handle, handleEvent, snooze, type Job } from '../../src/index.ts';

const sendWelcome = defineJob('types.welcome', { queue: 'email', schema: z.object({ userId: z.string(), email: z.email() }) });
const plain = defineJob<{ n: number }>('types.plain');

export async function readmeShapes(): Promise<void> {
  const mailroom = await createMailroom();
  await mailroom.enqueue(sendWelcome, { userId: 'u1', email: 'a@example.com' }, { key: 'k', delay: '5m', priority: 1, correlationId: 'c' });
  // @ts-expect-error: the schema's input type is enforced at enqueue
  await mailroom.enqueue(sendWelcome, { userId: 1 });
  await mailroom.enqueueMany(plain, [{ n: 1 }, { n: 2 }], { orderingKey: (d) => `k${d.n}` });
  mailroom.worker({
    queues: ['email'],
    handlers: {
      // Inline: the payload is unknown until narrowed.
      [plain.name]: async (job, ctx) => {
        const data: unknown = job.data;
        await ctx.tx.query('SELECT 1');
        return data === null ? snooze('1m') : undefined;
      },
      // Annotated: accepted as is.
      'types.annotated': async (job: Job<{ n: number }>) => job.data.n + 1,
      // handle(): typed by the definition.
      [sendWelcome.name]: handle(sendWelcome, async (job) => {
        const email: string = job.data.email;
        // @ts-expect-error: not a field of the payload
        void job.data.missing;
        return email;
      }),
    },
  });
}

const orderCreated = defineEvent('types.order-created', { version: 1, schema: z.object({ orderId: z.string(), total: z.number() }) });
const pinged = defineEvent<{ at: number }>('types.pinged', { version: 1 });

export async function eventShapes(): Promise<void> {
  const mailroom = await createMailroom();
  const { id }: { id: string } = await mailroom.publish(orderCreated, { orderId: 'o1', total: 5 }, { key: 'o1', correlationId: 'c' });
  void id;
  // @ts-expect-error: the schema's input type is enforced at publish
  await mailroom.publish(orderCreated, { orderId: 1, total: 5 });
  await mailroom.transaction(async (tx) => {
    await mailroom.publishMany(pinged, [{ at: 1 }, { at: 2 }], { tx, key: (d) => `k${d.at}` });
  });
  const relay = mailroom.relay({ batchSize: 200, to: [{ name: 'audit', publish: async (events) => void events.map((e) => e.envelope.id) }] });
  relay.on('held-back', (info) => void info.heldBackBy.pid);
  mailroom.consumer({
    group: 'billing',
    handlers: {
      [orderCreated.type]: handleEvent(orderCreated, async (event, ctx) => {
        const total: number = event.data.total;
        // @ts-expect-error: not a field of the payload
        void event.data.missing;
        await ctx.tx.query('SELECT 1');
        await mailroom.publish(pinged, { at: total }, { tx: ctx.tx, causationId: event.id, correlationId: event.correlationId ?? undefined });
      }),
      // Inline: the payload is unknown until narrowed.
      [pinged.type]: async (event) => {
        const data: unknown = event.data;
        return data;
      },
    },
  });
  const { relay: targets, consumers } = await mailroom.stats();
  void targets.internal?.heldBackBy?.ageSeconds;
  void consumers.billing?.duplicatesRejected;
}
