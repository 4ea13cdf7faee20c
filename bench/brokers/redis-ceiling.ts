/**
 * Redis's own ceiling for what the relay does, with no database: a bare
 * ioredis client adding entries of about `bodyBytes` to a stream (the fields
 * mailroom writes: id, type, content-type, body), in batches of 100: one
 * pipeline of XADDs, then wait for all its replies. No dedup guard: this is
 * the broker's figure, not the adapter's. Every argument is a string (the body
 * too): ioredis then writes a pipeline as one string, which measured 1.3-2x
 * faster here than with a Buffer body (it copies Buffers together). The target
 * writes its script calls' bytes itself instead (src/brokers/redis/encoded-command.ts),
 * which pays off for a call of hundreds of arguments; for these XADDs of 14 it
 * measured level with ioredis's own writing (Node 8-12 µs a message either way,
 * three alternating pairs, session 20). How durable an entry is depends on
 * the server (appendonly, appendfsync), not on the client: measure on a server
 * configured as in production. Creates and deletes its own stream.
 *
 *   npx tsx -e "import('./bench/brokers/redis-ceiling.ts').then(async (m) => console.log(await m.ceiling({ url: 'redis://127.0.0.1:6379', messages: 100000 })))"
 */
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { timeBatches, type CeilingOptions, type CeilingResult } from './ceiling-common.ts';

export type RedisCeilingOptions = CeilingOptions;

export async function ceiling(options: RedisCeilingOptions): Promise<CeilingResult> {
  const { url, messages } = options;
  const bodyBytes = options.bodyBytes ?? 300;
  const stream = `mailroom-ceiling-${process.pid}-${randomUUID().slice(0, 8)}`;
  const client = new Redis(url, { maxRetriesPerRequest: 0 });
  client.on('error', () => {});
  try {
    const body = 'x'.repeat(bodyBytes);
    const extra = Object.entries(options.headers ?? {}).flat();
    return await timeBatches(messages, async (n) => {
      const pipeline = client.pipeline();
      for (let i = 0; i < n; i++) {
        pipeline.xadd(stream, '*', 'id', randomUUID(), 'type', 'ceiling.measured', 'content-type', 'application/cloudevents+json; charset=utf-8', ...extra, 'body', body);
      }
      const replies = await pipeline.exec();
      const failed = replies?.find(([err]) => err !== null);
      if (!replies || replies.length !== n || failed) throw new Error(`ceiling: XADD failed: ${failed?.[0]?.message ?? 'no replies'}`);
    });
  } finally {
    await client.del(stream).catch(() => undefined);
    await client.quit().catch(() => client.disconnect());
  }
}
