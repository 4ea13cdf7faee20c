/**
 * Compile-time checks of the public API's types (run by `npm run typecheck`,
 * part of `npm test`): the README's shapes must type-check, and misuse must not.
 */
import { z } from 'zod';
import { createMailroom, defineJob, handle, snooze, type Job } from '../../src/index.ts';

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
