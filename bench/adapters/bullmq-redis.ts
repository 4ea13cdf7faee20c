/** BullMQ on Redis (its default backend), under a key prefix of its own that is removed afterwards. */
import { loadPeer } from '../load-peer.ts';
import { bullmqAdapter } from './bullmq-common.ts';
import type { Adapter, AdapterContext } from './types.ts';

interface RedisClient {
  scan(cursor: string, match: 'MATCH', pattern: string, count: 'COUNT', n: number): Promise<[string, string[]]>;
  del(...keys: string[]): Promise<number>;
  quit(): Promise<unknown>;
}

/** Deletes every key under the prefix (obliterate() leaves some behind when a run failed half-way). */
async function deletePrefix(redisUrl: string, prefix: string): Promise<void> {
  const { Redis } = await loadPeer<{ Redis: new (url: string) => RedisClient }>('ioredis');
  const redis = new Redis(redisUrl);
  try {
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
      if (keys.length > 0) await redis.del(...keys);
      cursor = next;
    } while (cursor !== '0');
  } finally {
    await redis.quit();
  }
}

export function bullmqRedisAdapter(ctx: AdapterContext): Adapter {
  const url = new URL(ctx.redisUrl);
  const connection = {
    host: url.hostname,
    port: Number(url.port || 6379),
    ...(url.password ? { password: decodeURIComponent(url.password) } : {}),
    ...(url.username ? { username: decodeURIComponent(url.username) } : {}),
    ...(url.pathname.length > 1 ? { db: Number(url.pathname.slice(1)) } : {}),
    maxRetriesPerRequest: null,
  };
  return bullmqAdapter({
    id: 'bullmq-redis',
    label: `Redis ${url.host}, a key prefix of its own for each measurement`,
    async prepare() {
      return { options: { connection, prefix: ctx.tag }, factory: undefined };
    },
    async cleanup() {
      await deletePrefix(ctx.redisUrl, ctx.tag);
    },
  });
}
