/**
 * A consumer group's source on a Redis stream: a Redis consumer group read
 * with XREADGROUP on a connection of its own, at most `prefetch` entries
 * delivered and not yet acknowledged, XAUTOCLAIM for entries whose consumer
 * died, XACK once mailroom has stored a message, and a reconnect loop.
 */
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type { Redis } from 'ioredis';
import { MailroomError } from '../../errors.ts';
import { Waker } from '../../worker/waker.ts';
import type { SafetyWarning } from '../safety.ts';
import type { ConsumerSource, SourceContext, SourceMessage, SourceRemoveContext } from '../source.ts';
import { serverWarnings, warningSubject } from './check.ts';
import { RedisConnection, reason } from './connection.ts';
import { entryParts, parseAutoclaimReply, parseReadReply, type StreamEntry } from './entries.ts';
import { forgetIdleConsumers } from './idle-consumers.ts';
import {
  defaultClaimIdleMs,
  redactUrl,
  resolveSourceOptions,
  type RedisSourceOptions,
  type ResolvedSourceOptions,
} from './options.ts';

const FIRST_BACKOFF_MS = 100;
const MAX_BACKOFF_MS = 5000;
/** Longest XREADGROUP BLOCK: a connection that died silently is noticed within this plus the grace. */
const MAX_BLOCK_MS = 5000;
/** How long past its BLOCK a command may go without a reply before the connection is given up. */
const REPLY_GRACE_MS = 10_000;
/** How long `ack()` waits for Redis before giving up quietly (the entry is then delivered again). */
const ACK_TIMEOUT_MS = 10_000;
/** Idle time given to entries handed back on stop or nack: any consumer's next XAUTOCLAIM takes them. */
const RELEASE_IDLE_MS = 24 * 3_600_000;

/**
 * A consumer group's source reading a Redis stream through a Redis consumer
 * group (created with MKSTREAM when missing). Reconnects on its own.
 *
 * @example
 * import { redisSource } from 'mailroom/redis';
 * const billing = mailroom.consumer({ group: 'billing', source: redisSource({ url: 'redis://127.0.0.1:6379', stream: 'orders' }), handlers });
 */
export function redisSource(options: RedisSourceOptions): ConsumerSource {
  return new RedisStreamSource(resolveSourceOptions(options));
}

class RedisStreamSource implements ConsumerSource {
  readonly kind = 'redis';
  readonly name: string;
  private session: Session | null = null;

  constructor(private readonly options: ResolvedSourceOptions) {
    this.name = options.stream;
  }

  async start(deliver: (message: SourceMessage) => void, context: SourceContext): Promise<void> {
    if (this.session) throw new MailroomError(`redis source ${this.name}: already started; stop() it first, or make another source`);
    const group = this.options.group ?? context.group;
    if (typeof group !== 'string' || group === '') {
      throw new MailroomError(`redis source ${this.name}: no consumer group name; pass group, or start it from a mailroom consumer`);
    }
    this.session = new Session(this.options, {
      group,
      consumer: this.options.consumer ?? `${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`,
      claimIdleMs: this.options.claimIdleMs ?? defaultClaimIdleMs(context.handlerTimeoutMs),
      deliver,
      context,
    });
    await this.session.started;
  }

  async stop(): Promise<void> {
    const session = this.session;
    if (!session) return;
    await session.stop();
    this.session = null;
  }

  async check(): Promise<SafetyWarning[]> {
    const connection = new RedisConnection(this.options.url, 'check');
    try {
      return await serverWarnings(await connection.get(), warningSubject(this.options.url, this.options.stream), 'source');
    } finally {
      await connection.close();
    }
  }

  /**
   * Destroys the stream's consumer group (the `group` option, else the
   * group's name) and its pending entries; the stream and its entries stay.
   * Refuses while this source runs.
   */
  async remove(context: SourceRemoveContext): Promise<string> {
    if (this.session) throw new MailroomError(`redis source ${this.name}: it is running; stop it before removing its consumer group`);
    const group = this.options.group ?? context.group;
    const what = `redis consumer group ${group} on ${warningSubject(this.options.url, this.options.stream)}`;
    const connection = new RedisConnection(this.options.url, 'remove');
    try {
      const client = await connection.get();
      if ((await client.exists(this.options.stream)) === 0) return `${what}: none to delete (no stream)`;
      const destroyed = Number(await client.call('XGROUP', ['DESTROY', this.options.stream, group]));
      return destroyed === 1 ? `${what} destroyed` : `${what}: none to delete`;
    } finally {
      await connection.close();
    }
  }
}

interface SessionSettings {
  group: string;
  consumer: string;
  claimIdleMs: number;
  deliver: (message: SourceMessage) => void;
  context: SourceContext;
}

/** One start() to stop() of a source. */
class Session {
  /** Resolves after the first attempt to connect and create the group, whether it worked or not. */
  readonly started: Promise<void>;
  private readonly done: Promise<void>;
  private readonly reader: RedisConnection;
  private readonly acks: RedisConnection;
  /** Entries delivered to mailroom and not yet acknowledged or handed back. */
  private readonly outstanding = new Set<string>();
  /** Entries read but not delivered because the source was stopping. */
  private readonly undelivered: string[] = [];
  /** Set when stop() begins: nothing more is delivered. */
  private stopped = false;
  /** Set when stop() has handed entries back and is closing the connections: acks are no longer sent. */
  private closed = false;
  private wakeSlot: (() => void) | null = null;
  /** Cuts a reconnect backoff short when the source stops. */
  private readonly backoff = new Waker();
  private ackQueue: string[] = [];
  /** Acks that failed (Redis unreachable): sent again after the next reconnect, before pending entries are re-read. */
  private unsentAcks: string[] = [];
  private ackFlush: Promise<void> | null = null;
  private claimCursor = '0-0';

  constructor(
    private readonly options: ResolvedSourceOptions,
    private readonly settings: SessionSettings,
  ) {
    this.reader = new RedisConnection(options.url, 'source');
    this.acks = new RedisConnection(options.url, 'acks');
    let markStarted!: () => void;
    this.started = new Promise((resolve) => {
      markStarted = resolve;
    });
    this.done = this.loop(markStarted);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.wakeSlot?.();
    this.backoff.poke();
    this.reader.drop();
    await this.done;
    while (this.ackFlush) await this.ackFlush;
    const handBack = [...this.outstanding, ...this.undelivered];
    this.outstanding.clear();
    if (handBack.length > 0) await this.release(handBack);
    this.closed = true;
    while (this.ackFlush) await this.ackFlush; // acks that came in meanwhile
    await Promise.all([this.acks.close(), this.reader.close()]);
  }

  private get free(): number {
    return this.options.prefetch - this.outstanding.size;
  }

  private async loop(markStarted: () => void): Promise<void> {
    let backoff = FIRST_BACKOFF_MS;
    while (!this.stopped) {
      try {
        const client = await this.reader.get();
        await this.createGroup(client);
        if (this.unsentAcks.length > 0) {
          const ids = this.unsentAcks;
          this.unsentAcks = [];
          try {
            await this.command(client, 'XACK', [this.options.stream, this.settings.group, ...ids], 0);
          } catch (err) {
            this.unsentAcks.push(...ids);
            throw err;
          }
        }
        markStarted();
        backoff = FIRST_BACKOFF_MS;
        await this.consume(client);
      } catch (err) {
        if (this.stopped) break;
        this.reader.drop();
        this.report(err, backoff);
        markStarted();
        await this.backoff.sleep(backoff);
        backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
      }
    }
    markStarted();
  }

  private async createGroup(client: Redis): Promise<void> {
    const start = this.options.from === 'earliest' ? '0' : '$';
    try {
      await client.call('XGROUP', ['CREATE', this.options.stream, this.settings.group, start, 'MKSTREAM']);
    } catch (err) {
      if (!/BUSYGROUP/.test(reason(err))) throw err;
    }
  }

  /** Reads until the connection fails or the source stops: first this consumer's own pending entries, then new ones. */
  private async consume(client: Redis): Promise<void> {
    const { stream } = this.options;
    const { group, consumer } = this.settings;
    const claimEveryMs = Math.max(1, Math.floor(this.settings.claimIdleMs / 2));
    let history = true;
    let historyCursor = '0';
    let nextClaimAt = 0;
    while (!this.stopped) {
      if (this.free <= 0) {
        await this.slotFreed();
        continue;
      }
      if (Date.now() >= nextClaimAt) {
        const more = await this.claim(client);
        nextClaimAt = more ? 0 : Date.now() + claimEveryMs;
        continue;
      }
      if (history) {
        const args = ['GROUP', group, consumer, 'COUNT', this.free, 'STREAMS', stream, historyCursor];
        const entries = parseReadReply(await this.command(client, 'XREADGROUP', args, 0));
        if (entries.length === 0) {
          history = false;
          continue;
        }
        historyCursor = entries[entries.length - 1]!.id;
        await this.handle(client, entries, '');
      } else {
        const block = Math.max(1, Math.min(MAX_BLOCK_MS, nextClaimAt - Date.now()));
        const args = ['GROUP', group, consumer, 'COUNT', this.free, 'BLOCK', block, 'STREAMS', stream, '>'];
        await this.handle(client, parseReadReply(await this.command(client, 'XREADGROUP', args, block)), '');
      }
    }
  }

  /**
   * One XAUTOCLAIM step: entries idle longer than claimIdle (their consumer
   * died or never acknowledged them) become this consumer's and are delivered.
   * Returns true when the scan of the pending list is not finished.
   */
  private async claim(client: Redis): Promise<boolean> {
    const { stream } = this.options;
    const { group, consumer, claimIdleMs } = this.settings;
    const args = [stream, group, consumer, claimIdleMs, this.claimCursor, 'COUNT', this.free];
    const { cursor, entries, deleted } = parseAutoclaimReply(await this.command(client, 'XAUTOCLAIM', args, 0));
    this.claimCursor = cursor;
    if (deleted.length > 0) this.reportDeleted(deleted);
    await this.handle(client, entries, ` (claimed: idle over ${claimIdleMs} ms)`);
    if (cursor !== '0-0') return true;
    // A full pass over the pending list: also drop consumers that hold nothing and stopped reading.
    await withTimeout(forgetIdleConsumers(client, stream, group, consumer, 2 * claimIdleMs), REPLY_GRACE_MS);
    return false;
  }

  private async handle(client: Redis, entries: readonly StreamEntry[], how: string): Promise<void> {
    const { stream } = this.options;
    const { group } = this.settings;
    const deleted: string[] = [];
    for (const entry of entries) {
      if (this.stopped) {
        if (!this.outstanding.has(entry.id)) this.undelivered.push(entry.id);
        continue;
      }
      if (entry.fields === null) {
        deleted.push(entry.id);
        continue;
      }
      if (this.outstanding.has(entry.id)) continue; // mailroom has it already (re-read or re-claimed)
      const { body, headers, messageId } = entryParts(entry.fields);
      const id = entry.id;
      this.outstanding.add(id);
      const message: SourceMessage = {
        body,
        messageId,
        headers,
        origin: `redis stream ${stream}, group ${group}, entry ${id}${how}`,
        ack: () => this.ack(id),
        nack: () => this.nack(id),
      };
      try {
        this.settings.deliver(message);
      } catch (err) {
        this.outstanding.delete(id);
        this.call(() => this.settings.context.report(err));
      }
    }
    if (deleted.length > 0) {
      // Their content is gone; acknowledging them takes them off the pending list.
      this.reportDeleted(deleted);
      await this.command(client, 'XACK', [stream, group, ...deleted], 0);
    }
  }

  private ack(id: string): Promise<void> {
    if (this.outstanding.delete(id)) this.wakeSlot?.();
    if (this.closed) return Promise.resolve(); // handed back on stop: it comes again and is deduplicated
    this.ackQueue.push(id);
    // Acks that arrive together (mailroom acks a stored batch at once) go out as one XACK.
    this.ackFlush ??= new Promise<void>((resolve) => setImmediate(resolve)).then(() => this.flushAcks());
    return this.ackFlush;
  }

  private async flushAcks(): Promise<void> {
    const ids = [...this.unsentAcks, ...this.ackQueue];
    this.unsentAcks = [];
    this.ackQueue = [];
    this.ackFlush = null;
    try {
      const client = await this.acks.get();
      await withTimeout(client.call('XACK', [this.options.stream, this.settings.group, ...ids]), ACK_TIMEOUT_MS);
    } catch {
      // Sent again after the reconnect. Until then the entries stay pending;
      // should they come again anyway, mailroom deduplicates them on the event id.
      if (!this.closed) this.unsentAcks.push(...ids);
    }
  }

  private async nack(id: string): Promise<void> {
    if (!this.outstanding.delete(id)) return;
    this.wakeSlot?.();
    if (!this.closed) await this.release([id]);
  }

  /**
   * Hands entries back: they stay pending, but with a long idle time, so the
   * next XAUTOCLAIM of any consumer of the group (this one too) takes them.
   */
  private async release(ids: readonly string[]): Promise<void> {
    const idle = Math.max(RELEASE_IDLE_MS, this.settings.claimIdleMs);
    try {
      const client = await this.acks.get();
      const args = [this.options.stream, this.settings.group, this.settings.consumer, 0, ...ids, 'IDLE', idle, 'JUSTID'];
      await withTimeout(client.call('XCLAIM', args), ACK_TIMEOUT_MS);
    } catch {
      // They are still pending: claimed once claimIdle has passed.
    }
  }

  private command(client: Redis, name: string, args: (string | number)[], blockMs: number): Promise<unknown> {
    return withTimeout(client.callBuffer(name, args), blockMs + REPLY_GRACE_MS, `no reply to ${name} within ${blockMs + REPLY_GRACE_MS} ms`);
  }

  private slotFreed(): Promise<void> {
    return new Promise((resolve) => {
      this.wakeSlot = () => {
        this.wakeSlot = null;
        resolve();
      };
    });
  }

  private report(err: unknown, retryInMs: number): void {
    const where = `stream ${this.options.stream}, group ${this.settings.group} on ${redactUrl(this.options.url)}`;
    const text = /cannot connect/.test(reason(err)) ? reason(err) : `redis source: reading ${where} failed: ${reason(err)}`;
    this.call(() => this.settings.context.report(new MailroomError(`${text}; retrying in ${retryInMs} ms`, { cause: err })));
  }

  private reportDeleted(ids: readonly string[]): void {
    const error = new MailroomError(
      `redis source: entries ${ids.join(', ')} of stream ${this.options.stream} were deleted (XDEL, or trimmed by MAXLEN) while pending ` +
        `in group ${this.settings.group}, before mailroom stored them: they cannot be delivered. Trim less (a larger maxLen) if this was trimming.`,
    );
    this.call(() => this.settings.context.report(error));
  }

  /** Calls into mailroom's callbacks without letting them break the loop. */
  private call(fn: () => void): void {
    try {
      fn();
    } catch {
      // A reporting hook that throws must not stop the source.
    }
  }
}

function withTimeout<T>(promise: Promise<T>, ms: number, message = `no reply within ${ms} ms`): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(message)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
