/**
 * The consumer source for NATS JetStream: a durable pull consumer read with
 * fetches sized so that at most `prefetch` messages are delivered and not yet
 * acknowledged, reconnecting on its own after a lost connection.
 */
import { jetstream, jetstreamManager, type Consumer, type ConsumerMessages, type JetStreamManager, type JsMsg } from '@nats-io/jetstream';
import type { NatsConnection } from '@nats-io/transport-node';
import type { SafetyWarning } from '../safety.ts';
import type { ConsumerSource, SourceCheckContext, SourceContext, SourceMessage, SourceRemoveContext } from '../source.ts';
import { sourceWarnings } from './check.ts';
import { closeQuietly, describeServers, openConnection, reason } from './connect.ts';
import { consumerInfoOrNull, DEFAULT_ACK_WAIT_MS, ensureConsumer, type ConsumerSpec } from './consumer.ts';
import { Waker } from '../../worker/waker.ts';
import { assertDurable, resolveSourceOptions, type NatsSourceOptions, type ResolvedNatsSourceOptions } from './options.ts';

/** How long one pull request waits at the server for messages. */
const PULL_EXPIRES_MS = 5_000;
const BACKOFF_FIRST_MS = 100;
const BACKOFF_MAX_MS = 5_000;

interface Session {
  nc: NatsConnection;
  jsm: JetStreamManager;
  consumer: Consumer;
}

/** One delivered message until mailroom acks or nacks it. */
interface Outstanding {
  readonly msg: JsMsg;
  readonly session: Session;
}

/** One `start()` … `stop()` of a source: its connection, its loop, its unacked messages. */
class Run {
  readonly #options: ResolvedNatsSourceOptions;
  readonly #spec: ConsumerSpec;
  readonly #deliver: (message: SourceMessage) => void;
  readonly #context: SourceContext;
  readonly #outstanding = new Set<Outstanding>();
  #session: Session | null = null;
  #fetch: ConsumerMessages | null = null;
  #stopped = false;
  /** Wakes the loop when capacity frees up or the run stops. */
  #wake: (() => void) | null = null;
  /** Cuts a backoff (or the wait after a reconnect) short when the run stops. */
  readonly #backoff = new Waker();
  #loop: Promise<void> = Promise.resolve();

  constructor(options: ResolvedNatsSourceOptions, spec: ConsumerSpec, deliver: (message: SourceMessage) => void, context: SourceContext) {
    this.#options = options;
    this.#spec = spec;
    this.#deliver = deliver;
    this.#context = context;
  }

  /** For errors: `consumer billing on stream orders (nats://127.0.0.1:4222)`. */
  get #label(): string {
    return `consumer ${this.#spec.durable} on stream ${this.#spec.stream} (${this.#spec.where})`;
  }

  /** Opens the first session (rejecting when it cannot) and starts the loop. */
  async begin(): Promise<void> {
    this.#session = await this.#open();
    this.#loop = this.#run();
  }

  async #open(): Promise<Session> {
    const nc = await openConnection(this.#options.servers, `mailroom consumer ${this.#spec.durable}`);
    try {
      const jsm = await jetstreamManager(nc);
      const { info } = await ensureConsumer(jsm, this.#spec);
      return { nc, jsm, consumer: jetstream(nc).consumers.getConsumerFromInfo(info) };
    } catch (error) {
      await closeQuietly(nc);
      throw error;
    }
  }

  async #run(): Promise<void> {
    let delayMs = BACKOFF_FIRST_MS;
    while (!this.#stopped) {
      try {
        if (this.#session === null) {
          this.#session = await this.#open();
          await this.#letRedeliveriesFirst(this.#session);
        }
        await this.#pull(this.#session);
        delayMs = BACKOFF_FIRST_MS;
      } catch (error) {
        if (this.#stopped) break;
        const session = this.#session;
        this.#session = null;
        await closeQuietly(session?.nc ?? null);
        this.#context.report(new Error(`nats: ${this.#label}: ${reason(error)}; reconnecting in ${delayMs} ms`, { cause: error }));
        await this.#backoff.sleep(delayMs);
        delayMs = Math.min(delayMs * 2, BACKOFF_MAX_MS);
      }
    }
  }

  /**
   * After a reconnect: messages the server had sent on the lost connection
   * stay pending until their AckWait runs out, and are then redelivered
   * before new ones. Fetching at once would store newer messages of a key
   * ahead of them, so while the consumer has messages pending, wait out the
   * AckWait first (per-key order over a broker restart). Not at start: after
   * a graceful stop the messages were given back (nak) and come first anyway.
   */
  async #letRedeliveriesFirst(session: Session): Promise<void> {
    const info = await session.jsm.consumers.info(this.#spec.stream, this.#spec.durable);
    if (info.num_ack_pending === 0 || this.#stopped) return;
    const waitMs = Math.ceil((info.config.ack_wait ?? this.#spec.ackWaitMs * 1_000_000) / 1_000_000) + 100;
    this.#context.report(
      new Error(`nats: ${this.#label}: ${info.num_ack_pending} message(s) are pending from the lost connection; waiting ${waitMs} ms (the AckWait) so they are redelivered before newer ones`),
    );
    await this.#backoff.sleep(waitMs);
  }

  /** Fetches while the session lives; returns after a completed fetch, throws when the connection is gone. */
  async #pull(session: Session): Promise<void> {
    await this.#capacity();
    if (this.#stopped) return;
    const want = this.#options.prefetch - this.#outstanding.size;
    const fetch = await session.consumer.fetch({ max_messages: want, expires: PULL_EXPIRES_MS });
    this.#fetch = fetch;
    try {
      for await (const msg of fetch) {
        if (this.#stopped) {
          settleQuietly(() => msg.nak());
          continue;
        }
        this.#hand(msg, session);
      }
    } finally {
      this.#fetch = null;
    }
    if (session.nc.isClosed() && !this.#stopped) {
      const why = await session.nc.closed();
      throw new Error(`connection closed${why ? `: ${reason(why)}` : ''}`);
    }
  }

  #hand(msg: JsMsg, session: Session): void {
    const entry: Outstanding = { msg, session };
    this.#outstanding.add(entry);
    const settle = (how: 'ack' | 'nak') => {
      if (!this.#outstanding.delete(entry)) return;
      this.#wake?.();
      if (!session.nc.isClosed()) settleQuietly(() => (how === 'ack' ? msg.ack() : msg.nak()));
    };
    const headers: Record<string, string> = {};
    if (msg.headers) for (const [name, values] of msg.headers) headers[name.toLowerCase()] = values.join(', ');
    const message: SourceMessage = {
      body: msg.data,
      messageId: headers['nats-msg-id'] ?? null,
      headers,
      origin: `nats stream ${msg.info.stream}, consumer ${msg.info.consumer}, sequence ${msg.seq}, delivery ${msg.info.deliveryCount}`,
      ack: () => settle('ack'),
      nack: () => settle('nak'),
    };
    try {
      this.#deliver(message);
    } catch (error) {
      settle('nak');
      this.#context.report(new Error(`nats: ${this.#label}: deliver threw for sequence ${msg.seq}: ${reason(error)}`, { cause: error }));
    }
  }

  /** Resolves once fewer than `prefetch` messages are unacknowledged, or the run stopped. */
  async #capacity(): Promise<void> {
    while (!this.#stopped && this.#outstanding.size >= this.#options.prefetch) {
      await new Promise<void>((resolve) => (this.#wake = resolve));
      this.#wake = null;
    }
  }

  /** Stops fetching, gives unacknowledged messages back (nak), closes the connection. */
  async end(): Promise<void> {
    this.#stopped = true;
    this.#wake?.();
    this.#backoff.poke();
    this.#fetch?.stop();
    await this.#loop;
    // The server must drop the stopped pull request before the naks: nats-server 2.9 hands a nak'd
    // message straight back to a waiting pull whose inbox is gone (and miscounts it as unprocessed);
    // a consumer info request makes it clear out pulls without interest first.
    if (this.#session && !this.#session.nc.isClosed() && this.#outstanding.size > 0) {
      await this.#session.nc.flush().catch(() => undefined);
      await this.#session.jsm.consumers.info(this.#spec.stream, this.#spec.durable).catch(() => undefined);
    }
    for (const entry of this.#outstanding) {
      if (!entry.session.nc.isClosed()) settleQuietly(() => entry.msg.nak());
    }
    this.#outstanding.clear();
    const session = this.#session;
    this.#session = null;
    await closeQuietly(session?.nc ?? null);
  }

  /** The run's management connection while it is up. */
  get jsm(): JetStreamManager | null {
    return this.#session && !this.#session.nc.isClosed() ? this.#session.jsm : null;
  }
}

function settleQuietly(fn: () => void): void {
  try {
    fn();
  } catch {
    // The connection it came on is gone: the server redelivers it after AckWait, mailroom deduplicates it.
  }
}

/** A consumer source reading a NATS JetStream durable pull consumer; see {@link natsSource}. */
export class NatsSource implements ConsumerSource {
  readonly kind = 'nats';
  readonly #options: ResolvedNatsSourceOptions;
  #group: string | null = null;
  #handlerTimeoutMs: number | null = null;
  #run: Run | null = null;

  constructor(options: NatsSourceOptions) {
    this.#options = resolveSourceOptions(options);
  }

  /** `<stream>/<durable>` (the durable is the group's name until `start` says which group). */
  get name(): string {
    const durable = this.#options.durable ?? this.#group;
    return durable === null ? this.#options.stream : `${this.#options.stream}/${durable}`;
  }

  #spec(durable: string, handlerTimeoutMs: number | null): ConsumerSpec {
    return {
      stream: this.#options.stream,
      durable,
      filterSubject: this.#options.filterSubject,
      ackWaitMs: this.#options.ackWaitMs ?? Math.max(DEFAULT_ACK_WAIT_MS, handlerTimeoutMs ?? 0),
      from: this.#options.from,
      where: describeServers(this.#options.servers),
    };
  }

  async start(deliver: (message: SourceMessage) => void, context: SourceContext): Promise<void> {
    if (this.#run) throw new Error(`nats: source ${this.name} is already started; stop() it before starting it again`);
    const durable = this.#options.durable ?? assertDurable(context.group, 'group');
    this.#group = context.group;
    this.#handlerTimeoutMs = context.handlerTimeoutMs;
    const run = new Run(this.#options, this.#spec(durable, context.handlerTimeoutMs), deliver, context);
    this.#run = run;
    try {
      await run.begin();
    } catch (error) {
      this.#run = null;
      throw error;
    }
  }

  async stop(): Promise<void> {
    const run = this.#run;
    this.#run = null;
    await run?.end();
  }

  /**
   * The durable consumer's settings that break a guarantee (`nats-ack-wait`,
   * `nats-max-deliver`), or that `start` refuses (`nats-consumer-refused`);
   * mailroom runs it right after `start`. Needs the
   * durable's name (the `durable` option, else the group of `context` or of an
   * earlier `start()`; without any it has nothing to check) and judges AckWait
   * against the handler timeout of `context`, else of the last `start()`.
   */
  async check(context?: SourceCheckContext): Promise<SafetyWarning[]> {
    const durable = this.#options.durable ?? context?.group ?? this.#group;
    if (durable === null) return [];
    const handlerTimeoutMs = context === undefined ? this.#handlerTimeoutMs : context.handlerTimeoutMs;
    const spec = this.#spec(durable, handlerTimeoutMs);
    const shared = this.#run?.jsm ?? null;
    const nc = shared ? null : await openConnection(this.#options.servers, `mailroom check ${durable}`);
    try {
      const jsm = shared ?? (await jetstreamManager(nc!));
      const info = await consumerInfoOrNull(jsm, spec.stream, durable);
      return info ? sourceWarnings(info, handlerTimeoutMs, `nats ${spec.where} stream ${spec.stream} consumer ${durable}`) : [];
    } finally {
      await closeQuietly(nc);
    }
  }
  /**
   * Deletes the durable consumer (the `durable` option, else the group's
   * name) and with it the stream's record of what it has taken; the stream
   * and its messages stay. Refuses while this source runs.
   */
  async remove(context: SourceRemoveContext): Promise<string> {
    if (this.#run) throw new Error(`nats: source ${this.name} is running; stop it before removing its consumer`);
    const durable = this.#options.durable ?? assertDurable(context.group, 'group');
    const what = `nats consumer ${durable} on stream ${this.#options.stream} (${describeServers(this.#options.servers)})`;
    const nc = await openConnection(this.#options.servers, `mailroom remove ${durable}`);
    try {
      const jsm = await jetstreamManager(nc);
      if ((await consumerInfoOrNull(jsm, this.#options.stream, durable)) === null) return `${what}: none to delete`;
      await jsm.consumers.delete(this.#options.stream, durable);
      return `${what} deleted`;
    } finally {
      await closeQuietly(nc);
    }
  }
}

/**
 * A consumer source reading a NATS JetStream stream through a durable pull
 * consumer (created when missing: explicit acks, unlimited redelivery, AckWait
 * covering the handler timeout). Keeps at most `prefetch` messages unacked,
 * reconnects on its own, and gives unacked messages back on `stop()`.
 *
 * @example
 * import { natsSource } from 'mailroom/nats';
 * const billing = mailroom.consumer({ group: 'billing', source: natsSource({ url: 'nats://127.0.0.1:4222', stream: 'orders' }), handlers });
 */
export function natsSource(options: NatsSourceOptions): NatsSource {
  return new NatsSource(options);
}
