/**
 * The relay target for Redis Streams: each event is added to the stream by a
 * Lua script, up to 100 events per script call, each sent as its values only
 * (the script names the fields); a batch's calls are written on one connection
 * in one write (`sendInOrder`), so they reach Redis in outbox order, and
 * `publish` resolves when every reply is in. The relay's
 * batches are guarded by their events' marks in the outbox (mark-script.ts),
 * anything else by a dedup key per event id (add-script.ts).
 */
import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { MailroomError } from '../../errors.ts';
import type { RelayContext, RelayedEvent, RelayTarget } from '../../relay/target.ts';
import type { SafetyWarning, TargetCheckContext } from '../safety.ts';
import { CLOUDEVENTS_CONTENT_TYPE, wireTextOf } from '../wire.ts';
import { storedRowOf } from '../../relay/stored-event.ts';
import { ADD_SCRIPT, ADD_SCRIPT_SHA, dedupKey, eventArguments, EVENTS_PER_CALL } from './add-script.ts';
import { guardKeys, markOf, MARK_SCRIPT, MARK_SCRIPT_SHA } from './mark-script.ts';
import { dedupWindowWarning, guardByIdWarning, serverWarnings, warningSubject } from './check.ts';
import { RedisConnection, reason } from './connection.ts';
import { EncodedCommand, sendInOrder } from './encoded-command.ts';
import { redactUrl, resolveTargetOptions, type RedisTargetOptions, type ResolvedTargetOptions } from './options.ts';

/**
 * A relay target that adds every event to a Redis stream once: the relay's
 * batches are recognised by their place in the outbox (for good, with two keys
 * per outbox and stream), other publishes by event id within `dedupWindow`.
 * Connects on the first publish.
 *
 * @example
 * import { redisStreams } from 'mailroom/redis';
 * const relay = mailroom.relay({ to: [redisStreams({ url: 'redis://127.0.0.1:6379', stream: 'orders' })] });
 */
export function redisStreams(options: RedisTargetOptions): RelayTarget {
  return new RedisStreamsTarget(resolveTargetOptions(options));
}

class RedisStreamsTarget implements RelayTarget {
  readonly name: string;
  /** Publishes without the relay's transaction: the relay reads the next batch while this one is confirmed. */
  readonly readAhead = true;
  /** The next batch goes out before this one's replies, its first run needing this one's last event added. */
  readonly pipelined = true;
  private readonly connection: RedisConnection;

  constructor(private readonly options: ResolvedTargetOptions) {
    this.name = options.name;
    this.connection = new RedisConnection(options.url, 'target', loadScript);
  }

  /**
   * Adds the batch and resolves when every reply is in. With `context.after`,
   * the first run adds nothing unless that event was added (the guard knows
   * its place, or its dedup key is there), so a batch sent before the one
   * ahead of it is confirmed cannot overtake it. With `context.origin` (the
   * relay's batches) events are guarded by their place in the outbox, else
   * by event id.
   */
  async publish(events: readonly RelayedEvent[], context: RelayContext): Promise<void> {
    if (events.length === 0) return;
    const { ackTimeoutMs } = this.options;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        // Replies that come later belong to a connection nobody reads any more.
        this.connection.drop();
        reject(
          new MailroomError(
            `redis target ${this.name}: no reply from ${redactUrl(this.options.url)} within ${ackTimeoutMs} ms for a batch of ${events.length} ` +
              `events on stream ${this.options.stream}; the relay retries the batch (is the server stalled or overloaded? ackTimeout sets the limit)`,
          ),
        );
      }, ackTimeoutMs);
    });
    try {
      await Promise.race([this.send(events, context?.after, context?.origin), timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  private async send(events: readonly RelayedEvent[], after: RelayedEvent | undefined, origin: string | undefined): Promise<void> {
    const client = await this.connection.get();
    const calls: EncodedCommand[] = [];
    const runs = origin === undefined ? this.byId(calls, events, after) : this.byMark(calls, events, after, origin);
    const replies = await sendInOrder(client, calls);
    const failed = replies.findIndex(([err]) => err !== null);
    if (failed >= 0) {
      const err = replies[failed]![0]!;
      // NOSCRIPT (SCRIPT FLUSH) or a lost connection: start afresh on the next publish.
      if (/NOSCRIPT/.test(err.message) || client.status !== 'ready') this.connection.drop();
      const first = runs[failed]!;
      throw this.failure(events.length, err, first, storedRowOf(events[first]!).id);
    }
  }

  /**
   * The relay's batch, guarded by marks (see mark-script.ts): one call per run,
   * the batch's highest mark on the last. Returns the index of each run's first event.
   */
  private byMark(calls: EncodedCommand[], events: readonly RelayedEvent[], after: RelayedEvent | undefined, origin: string): number[] {
    const { stream, maxLen } = this.options;
    const keys = [stream, ...guardKeys(stream, origin)];
    const attempt = randomBytes(8).toString('hex');
    const marks = events.map((event) => markOf(storedRowOf(event)));
    let highest = '';
    for (const mark of marks) if (mark > highest) highest = mark;
    let before = after === undefined ? '' : markOf(storedRowOf(after));
    const runs: number[] = [];
    for (let start = 0; start < events.length; start += EVENTS_PER_CALL) {
      runs.push(start);
      const end = Math.min(start + EVENTS_PER_CALL, events.length);
      const args: (string | number)[] = [MARK_SCRIPT_SHA, keys.length, ...keys, attempt, end === events.length ? highest : '', before, maxLen ?? '', CLOUDEVENTS_CONTENT_TYPE];
      for (let i = start; i < end; i++) {
        args.push(marks[i]!);
        eventArguments(args, wireTextOf(events[i]!));
      }
      before = marks[end - 1]!;
      calls.push(new EncodedCommand('EVALSHA', args));
    }
    return runs;
  }

  /** Events published without the relay's origin, guarded by a dedup key per event id. Returns the index of each run's first event. */
  private byId(calls: EncodedCommand[], events: readonly RelayedEvent[], after: RelayedEvent | undefined): number[] {
    const { stream, dedupWindowMs, maxLen } = this.options;
    let previous: string | null = after === undefined ? null : dedupKey(stream, storedRowOf(after).id);
    const runs: number[] = [];
    for (let start = 0; start < events.length; start += EVENTS_PER_CALL) {
      runs.push(start);
      const keys: string[] = previous === null ? [stream] : [stream, previous];
      const args: (string | number)[] = [previous === null ? '0' : '1', dedupWindowMs, maxLen ?? '', CLOUDEVENTS_CONTENT_TYPE];
      for (const event of events.slice(start, start + EVENTS_PER_CALL)) {
        const message = wireTextOf(event);
        const key = dedupKey(stream, message.id);
        keys.push(key);
        eventArguments(args, message);
        previous = key;
      }
      calls.push(new EncodedCommand('EVALSHA', [ADD_SCRIPT_SHA, keys.length, ...keys, ...args]));
    }
    return runs;
  }

  private failure(count: number, err: unknown, index?: number, id?: string): MailroomError {
    const which = index === undefined ? '' : ` in the events from ${index + 1} (${id}) on`;
    return new MailroomError(
      `redis target ${this.name}: adding ${count} events to stream ${this.options.stream} on ${redactUrl(this.options.url)} failed${which}: ` +
        `${reason(err)}; the relay retries the batch`,
      { cause: err },
    );
  }

  async check(context: TargetCheckContext): Promise<SafetyWarning[]> {
    const subject = warningSubject(this.options.url, this.options.stream);
    const warnings = [
      ...dedupWindowWarning(subject, this.options.dedupWindowMs, context.republishHorizonMs),
      ...guardByIdWarning(subject, context.origin, this.options.dedupWindowMs),
    ];
    const client = await this.connection.get();
    return [...warnings, ...(await serverWarnings(client, subject, 'target'))];
  }

  async close(): Promise<void> {
    await this.connection.close();
  }
}

async function loadScript(client: Redis): Promise<void> {
  for (const [script, expected] of [
    [ADD_SCRIPT, ADD_SCRIPT_SHA],
    [MARK_SCRIPT, MARK_SCRIPT_SHA],
  ]) {
    const sha = await client.call('SCRIPT', ['LOAD', script!]);
    if (sha !== expected) throw new Error(`SCRIPT LOAD returned ${String(sha)}, expected ${expected}`);
  }
}
