/**
 * The Redis Streams fixture of the shared broker adapter suite, and a private
 * redis-server (AOF on, `appendfsync always`) for tests that restart, stop or
 * freeze the broker. Non-restartable pairs live on REDIS_URL (the shared
 * server, which keeps nothing on disk: its `redis-no-persistence` warning is
 * expected there).
 *
 * A pair's stream is `mailroom-<unique>` and its Redis consumer group
 * `g-<unique>`, created at once (from the start of the stream), so events
 * published before a source starts are delivered and `pending()` works.
 * Sources get `claimIdle: '2s'`: an entry a stopped source held is claimed by
 * another source at its next claim round (stop hands entries back), one a
 * killed process held after 2-3 s.
 */
import { freePort } from './free-port.ts';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { redisSource, redisStreams } from '../../../src/brokers/redis/index.ts';
import type { ConsumerSource } from '../../../src/brokers/source.ts';
import type { RelayTarget } from '../../../src/relay/target.ts';
import type { BrokerFixture, BrokerPair, PairDescription, RawPublisher } from './fixture.ts';

/** Claim threshold of the fixture's sources. */
export const FIXTURE_CLAIM_IDLE = '2s';

/** Private servers still running: stopped when this process exits, even when it crashes. */
const running = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

/** A redis-server of this test process, on a free port, with its data in a temporary directory. */
export class PrivateRedis {
  private child: ChildProcess | null = null;

  private constructor(
    readonly port: number,
    readonly dir: string,
  ) {}

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  /** Starts a new server and resolves once it answers PING. */
  static async start(): Promise<PrivateRedis> {
    const server = new PrivateRedis(await freePort(), await mkdtemp(join(tmpdir(), 'mailroom-redis-')));
    await server.up();
    return server;
  }

  /** Starts the server again (same port, same directory: the AOF is replayed). */
  async up(): Promise<void> {
    if (this.child) return;
    const args = ['--port', String(this.port), '--bind', '127.0.0.1', '--appendonly', 'yes', '--appendfsync', 'always'];
    args.push('--dir', this.dir, '--save', '', '--daemonize', 'no', '--logfile', '');
    const child = spawn('redis-server', args, { stdio: ['ignore', 'ignore', 'pipe'] });
    this.child = child;
    running.add(child);
    let stderr = '';
    child.stderr?.on('data', (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    child.once('exit', () => {
      running.delete(child);
      if (this.child === child) this.child = null;
    });
    const deadline = Date.now() + 10_000;
    while (!(await answersPing(this.port))) {
      if (this.child !== child || Date.now() > deadline) {
        throw new Error(`redis-server on port ${this.port} did not start: ${stderr || 'no output'}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
  }

  /** Stops the server (SIGTERM: Redis flushes the AOF and exits) and waits for it to exit. */
  async down(): Promise<void> {
    const child = this.child;
    if (!child) return;
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGTERM');
    await exited;
    this.child = null;
  }

  async restart(): Promise<void> {
    await this.down();
    // Down for a second, as a real restart is: a relay publishing every few ms meets the outage.
    await new Promise((resolve) => setTimeout(resolve, 1000));
    await this.up();
  }

  /** Freezes (SIGSTOP) or thaws (SIGCONT) the server: connections stay open and nothing answers. */
  freeze(frozen: boolean): void {
    this.child?.kill(frozen ? 'SIGSTOP' : 'SIGCONT');
  }

  async cleanup(): Promise<void> {
    this.freeze(false);
    await this.down();
    await rm(this.dir, { recursive: true, force: true });
  }
}


function answersPing(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ port, host: '127.0.0.1' });
    let reply = '';
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(500, () => done(false));
    socket.once('error', () => done(false));
    socket.once('connect', () => socket.write('PING\r\n'));
    socket.on('data', (chunk) => {
      reply += chunk.toString();
      if (reply.includes('\r\n')) done(reply.startsWith('+PONG'));
    });
  });
}

/** A stream and mailroom's keys beside it, for cleanup: `{stream}:mailroom:*` (the dedup keys, and the relay guard's state and marks). */
async function deleteStream(admin: Redis, stream: string): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await admin.scan(cursor, 'MATCH', `{${stream}}:mailroom:*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) await admin.del(...keys);
  } while (cursor !== '0');
  await admin.del(stream);
}

/** Entries of the stream the group has not acknowledged: pending ones plus those not read yet. */
export async function groupBacklog(admin: Redis, stream: string, group: string): Promise<number> {
  const groups = (await admin.call('XINFO', ['GROUPS', stream])) as unknown[][];
  for (const item of groups) {
    const info = new Map<string, unknown>();
    for (let i = 0; i + 1 < item.length; i += 2) info.set(String(item[i]), item[i + 1]);
    if (info.get('name') !== group) continue;
    const pending = Number(info.get('pending'));
    const lag = info.get('lag');
    if (typeof lag === 'number') return pending + lag;
    const unread = (await admin.xrange(stream, `(${String(info.get('last-delivered-id'))}`, '+')).length;
    return pending + unread;
  }
  throw new Error(`stream ${stream} has no group ${group}`);
}

export interface RedisPair extends BrokerPair {
  readonly url: string;
  readonly stream: string;
  readonly group: string;
  /** A plain client on the pair's server (reconnects on its own). */
  readonly admin: Redis;
  /** The private server of a restartable pair, else null. */
  readonly server: PrivateRedis | null;
}

function sourceOf(url: string, stream: string, group: string, prefetch?: number): ConsumerSource {
  return redisSource({ url, stream, group, claimIdle: FIXTURE_CLAIM_IDLE, ...(prefetch === undefined ? {} : { prefetch }) });
}

const url = process.env.REDIS_URL ?? null;

/** The fixture, with pairs that also expose their stream, group, server and a plain client (for this broker's own tests). */
export interface RedisFixture extends BrokerFixture {
  pair(unique: string, options?: { restartable?: boolean }): Promise<RedisPair>;
}

export const fixture: RedisFixture = {
  kind: 'redis',
  url,

  async pair(unique: string, options: { restartable?: boolean } = {}): Promise<RedisPair> {
    if (!url) throw new Error('set REDIS_URL to run the Redis broker tests');
    const server = options.restartable ? await PrivateRedis.start() : null;
    const pairUrl = server ? server.url : url;
    const stream = `mailroom-${unique}`;
    const group = `g-${unique}`;
    const admin = new Redis(pairUrl, { protocol: 2, maxRetriesPerRequest: 2 });
    admin.on('error', () => undefined);
    await deleteStream(admin, stream);
    await admin.call('XGROUP', ['CREATE', stream, group, '0', 'MKSTREAM']);
    const targets: RelayTarget[] = [];
    return {
      url: pairUrl,
      stream,
      group,
      admin,
      server,
      target() {
        const target = redisStreams({ url: pairUrl, stream, ackTimeout: '5s' });
        targets.push(target);
        return target;
      },
      source(sourceOptions?: { prefetch?: number }) {
        return sourceOf(pairUrl, stream, group, sourceOptions?.prefetch);
      },
      async raw(): Promise<RawPublisher> {
        const client = new Redis(pairUrl, { protocol: 2 });
        client.on('error', () => undefined);
        return {
          async publish(body, publishOptions) {
            const fields: (string | Buffer)[] = [];
            if (publishOptions?.messageId !== undefined) fields.push('id', publishOptions.messageId);
            for (const [name, value] of Object.entries(publishOptions?.headers ?? {})) fields.push(name, value);
            fields.push('body', body);
            await client.xadd(stream, '*', ...fields);
          },
          async close() {
            await client.quit().catch(() => client.disconnect());
          },
        };
      },
      pending: () => groupBacklog(admin, stream, group),
      async restart() {
        if (!server) throw new Error('restart() needs a pair made with { restartable: true }');
        await server.restart();
      },
      describe(): PairDescription {
        return { kind: 'redis', url: pairUrl, stream, group };
      },
      async cleanup() {
        await Promise.all(targets.map((t) => t.close?.()));
        if (server) {
          admin.disconnect();
          await server.cleanup();
        } else {
          await deleteStream(admin, stream);
          await admin.quit().catch(() => admin.disconnect());
        }
      },
    };
  },

  sourceFrom(description: PairDescription, options?: { prefetch?: number }): ConsumerSource {
    const { url: u, stream, group } = description;
    if (typeof u !== 'string' || typeof stream !== 'string' || typeof group !== 'string') {
      throw new Error(`not a Redis pair description: ${JSON.stringify(description)}`);
    }
    return sourceOf(u, stream, group, options?.prefetch);
  },
};
