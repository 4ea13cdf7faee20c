/**
 * One Redis connection that is opened on first use and opened again on the
 * next use after it was lost. ioredis's own reconnecting and offline queue are
 * off: a command on a lost connection fails at once, and the caller (the
 * target's next publish, the source's read loop) decides when to try again.
 */
import { hostname } from 'node:os';
import { Redis } from 'ioredis';
import { MailroomError } from '../../errors.ts';
import { redactUrl } from './options.ts';

const CONNECT_TIMEOUT_MS = 10_000;

/**
 * @example
 * const connection = new RedisConnection('redis://127.0.0.1:6379', 'target');
 * await (await connection.get()).call('PING');
 * await connection.close();
 */
export class RedisConnection {
  private client: Redis | null = null;
  private opening: Promise<Redis> | null = null;
  /** Bumped by `close()`: a connect that was under way when it was called is thrown away. */
  private epoch = 0;

  /**
   * @param url the server
   * @param role what the connection is for, in errors and `CLIENT LIST` (`target`, `source`, `acks`)
   * @param prepare runs on each new connection before it is handed out (e.g. `SCRIPT LOAD`)
   */
  constructor(
    private readonly url: string,
    private readonly role: string,
    private readonly prepare?: (client: Redis) => Promise<void>,
  ) {}

  /** The connected client; opens one when there is none or the last one was lost. */
  get(): Promise<Redis> {
    if (this.client && this.client.status === 'ready') return Promise.resolve(this.client);
    this.opening ??= this.open().finally(() => {
      this.opening = null;
    });
    return this.opening;
  }

  /** Whether a connection is open and ready now. */
  get ready(): boolean {
    return this.client !== null && this.client.status === 'ready';
  }

  /** Drops the connection at once (commands in flight fail); the next `get()` opens a new one. */
  drop(): void {
    const client = this.client;
    this.client = null;
    client?.disconnect();
  }

  /** Closes the connection, politely (`QUIT`) when it is healthy. A later `get()` opens a new one. */
  async close(): Promise<void> {
    this.epoch += 1;
    const opening = this.opening;
    if (opening) await opening.catch(() => undefined);
    const client = this.client;
    this.client = null;
    if (!client) return;
    if (client.status === 'ready') {
      await Promise.race([client.quit().catch(() => undefined), new Promise((resolve) => setTimeout(resolve, 1000).unref())]);
    }
    client.disconnect();
  }

  private async open(): Promise<Redis> {
    this.drop();
    const epoch = this.epoch;
    const client = new Redis(this.url, {
      lazyConnect: true,
      // RESP2: the reply shapes the parsers expect, on every server version.
      protocol: 2,
      retryStrategy: () => null,
      enableOfflineQueue: false,
      autoResendUnfulfilledCommands: false,
      maxRetriesPerRequest: 0,
      connectTimeout: CONNECT_TIMEOUT_MS,
      connectionName: `mailroom-${this.role}-${hostname().replace(/[^A-Za-z0-9.-]/g, '-')}-${process.pid}`,
    });
    let lastError: unknown = null;
    // Without a listener ioredis prints every connection error; the caller reports them instead.
    client.on('error', (err: unknown) => {
      lastError = err;
    });
    try {
      await client.connect();
      if (this.prepare) await this.prepare(client);
    } catch (err) {
      client.disconnect();
      throw connectionError(this.url, this.role, lastError ?? err);
    }
    if (epoch !== this.epoch) {
      client.disconnect();
      throw new MailroomError(`redis ${this.role}: the connection to ${redactUrl(this.url)} was closed`);
    }
    this.client = client;
    return client;
  }
}

/**
 * An error for a failed connect that names the server and says what to check.
 *
 * @example
 * connectionError('redis://127.0.0.1:6379', 'target', err).message // 'redis target: cannot connect to redis://127.0.0.1:6379 (…); check …'
 */
export function connectionError(url: string, role: string, cause: unknown): MailroomError {
  const reason = cause instanceof Error ? cause.message : String(cause);
  return new MailroomError(
    `redis ${role}: cannot connect to ${redactUrl(url)} (${reason}); check that Redis is running there, and the url's host, port and password`,
    { cause },
  );
}

/**
 * The message of an error, for wrapping.
 *
 * @example
 * reason(new Error('boom')) // 'boom'
 */
export function reason(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
