/**
 * Redis's own ceiling for what the relay does, with no database: a bare
 * ioredis client adding entries of about `bodyBytes` to a stream (the fields
 * mailroom writes: id, type, content-type, body), in batches of 100: one
 * pipeline of XADDs, then wait for all its replies. No dedup guard: this is
 * the broker's figure, not the adapter's. How durable an entry is depends on
 * the server (appendonly, appendfsync), not on the client: measure on a server
 * configured as in production. Creates and deletes its own stream.
 *
 *   npx tsx -e "import('./bench/brokers/redis-ceiling.ts').then(async (m) => console.log(await m.ceiling({ url: 'redis://127.0.0.1:6379', messages: 100000 })))"
 */
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { now } from '../stats.ts';

export interface RedisCeilingOptions {
  url: string;
  messages: number;
  /** Body size in bytes. Default 300 (about a small CloudEvents document). */
  bodyBytes?: number;
  /** Transport headers on every entry, as fields (as the relay sends: `partitionkey`, `traceparent`, …). Default none. */
  headers?: Record<string, string>;
}

export interface CeilingResult {
  perSecond: number;
  messages: number;
  seconds: number;
}

const BATCH = 100;

export async function ceiling(options: RedisCeilingOptions): Promise<CeilingResult> {
  const { url, messages } = options;
  const bodyBytes = options.bodyBytes ?? 300;
  if (!Number.isInteger(messages) || messages < 1) throw new Error(`ceiling: messages must be a positive integer, got ${messages}`);
  const stream = `mailroom-ceiling-${process.pid}-${randomUUID().slice(0, 8)}`;
  const client = new Redis(url, { maxRetriesPerRequest: 0 });
  client.on('error', () => {});
  try {
    const body = Buffer.alloc(bodyBytes, 'x');
    const extra = Object.entries(options.headers ?? {}).flat();
    const started = now();
    for (let sent = 0; sent < messages; ) {
      const n = Math.min(BATCH, messages - sent);
      const pipeline = client.pipeline();
      for (let i = 0; i < n; i++) {
        pipeline.xadd(stream, '*', 'id', randomUUID(), 'type', 'ceiling.measured', 'content-type', 'application/cloudevents+json; charset=utf-8', ...extra, 'body', body);
      }
      const replies = await pipeline.exec();
      const failed = replies?.find(([err]) => err !== null);
      if (!replies || replies.length !== n || failed) throw new Error(`ceiling: XADD failed: ${failed?.[0]?.message ?? 'no replies'}`);
      sent += n;
    }
    const seconds = (now() - started) / 1000;
    return { perSecond: messages / seconds, messages, seconds };
  } finally {
    await client.del(stream).catch(() => undefined);
    await client.quit().catch(() => client.disconnect());
  }
}
