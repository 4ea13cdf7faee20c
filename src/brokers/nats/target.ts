/**
 * The relay target for NATS JetStream: publishes each batch on one connection
 * with the event id as `Nats-Msg-Id` (the stream's deduplication), and
 * resolves only when every event has its PubAck.
 */
import { jetstreamManager, type JetStreamManager } from '@nats-io/jetstream';
import type { NatsConnection } from '@nats-io/transport-node';
import type { SafetyWarning, TargetCheckContext } from '../safety.ts';
import { wireTextOf, type WireText } from '../wire.ts';
import { storedRowOf } from '../../relay/stored-event.ts';
import type { RelayContext, RelayedEvent, RelayTarget } from '../../relay/target.ts';
import { RefusedEventError } from '../../relay/refused.ts';
import { targetWarnings } from './check.ts';
import { closeQuietly, describeServers, openConnection, reason } from './connect.ts';
import { isLiteralSubject, resolveTargetOptions, type NatsTargetOptions, type ResolvedNatsTargetOptions } from './options.ts';
import { ensureStream, MIN_DUPLICATE_WINDOW_MS, streamInfoOrNull } from './stream.ts';
import { NoStreamError, PubAckError, PubAckInbox, type PubAckOutcome } from './pub-acks.ts';

/** What a NATS header value cannot hold. */
const LINE_BREAK = /[\r\n]/;

/** The server's error code for a failed `Nats-Expected-Last-Msg-Id` check. */
const WRONG_LAST_MSG_ID = 10070;

/** The stream's error code for a message larger than its `max_msg_size`. */
const MESSAGE_TOO_LARGE = 10054;

interface Session {
  nc: NatsConnection;
  jsm: JetStreamManager;
  acks: PubAckInbox;
}

/** A relay target publishing to a NATS JetStream stream; see {@link nats}. */
export class NatsTarget implements RelayTarget {
  readonly name: string;
  /** Publishes without the relay's transaction: the relay reads the next batch while this one is confirmed. */
  readonly readAhead = true;
  /** The next batch goes out before this one's PubAcks, its first event expecting this one's last as the stream's last. */
  readonly pipelined = true;
  readonly #options: ResolvedNatsTargetOptions;
  #session: Session | null = null;
  #connecting: Promise<Session> | null = null;
  /** The relay's republish horizon from the last `check()`: a declared stream's duplicate window covers it. */
  #horizonMs = 0;

  constructor(options: NatsTargetOptions) {
    this.#options = resolveTargetOptions(options);
    this.name = this.#options.name;
  }

  /** Event types already found valid as subject tokens (a few hundred at most in practice; cleared when full). */
  readonly #subjectTypes = new Set<string>();

  #isSubjectType(type: string): boolean {
    if (this.#subjectTypes.has(type)) return true;
    if (!isLiteralSubject(type)) return false;
    if (this.#subjectTypes.size >= 1024) this.#subjectTypes.clear();
    this.#subjectTypes.add(type);
    return true;
  }

  /** `nats <servers> stream <stream>`: the subject of this target's warnings. */
  get #subject(): string {
    return `nats ${describeServers(this.#options.servers)} stream ${this.#options.stream}`;
  }

  /**
   * Publishes the batch and resolves once every event has its PubAck
   * (`context.tx` is not used). With `context.after`, the first event expects
   * that event as the stream's last message, and any refusal rejects the
   * whole batch (the relay sends it again once the batch before is confirmed).
   */
  async publish(events: readonly RelayedEvent[], context?: RelayContext): Promise<void> {
    if (events.length === 0) return;
    const messages = events.map(wireTextOf);
    for (const m of messages) {
      if (!this.#isSubjectType(m.type)) throw new RefusedEventError(m.id, `nats: its type ${JSON.stringify(m.type)} is not a valid subject token sequence`);
      if (LINE_BREAK.test(m.id)) throw new RefusedEventError(m.id, `nats: its id ${JSON.stringify(m.id)} holds a line break, which a Nats-Msg-Id header cannot`);
    }
    const session = await this.#connected();
    const deadline = Date.now() + this.#options.ackTimeoutMs;
    try {
      await this.#publishChained(session, messages, deadline, context?.after === undefined ? null : storedRowOf(context.after).id);
    } catch (error) {
      // A stalled or broken connection is replaced on the next publish.
      if (session.nc.isClosed() || isTimeout(error)) this.#drop(session);
      throw error;
    }
  }

  /**
   * Sends the whole batch at once (pipelined, in order, on one connection),
   * every event after the first expecting its predecessor as the stream's
   * last message id. A lost event thus also fails every later one, so no
   * later event is ever stored ahead of an earlier one. When something else
   * published into the stream in between (the expectation fails, nothing
   * else did), the rest of the batch goes one event at a time. With
   * `afterId` (a pipelined send: the event before the batch, maybe not yet
   * stored) the first event expects it too, and any refusal rejects: the
   * relay sends the batch again once the one before is confirmed.
   */
  async #publishChained(session: Session, messages: readonly WireText[], deadline: number, afterId: string | null): Promise<void> {
    const outcomes = await this.#sendAll(session, messages, deadline, afterId);
    const first = outcomes.findIndex((o) => !o.ok);
    if (first === -1) return;
    const failed = outcomes[first] as { ok: false; error: unknown };
    const refusal = refusalOf(failed.error);
    if (refusal !== null) throw this.#refused(messages[first]!, refusal, failed.error);
    if (afterId !== null || !(failed.error instanceof PubAckError && failed.error.errCode === WRONG_LAST_MSG_ID)) {
      throw this.#publishError(messages[first]!, failed.error, first, messages.length);
    }
    for (let i = first; i < messages.length; i++) {
      const [outcome] = await this.#sendAll(session, [messages[i]!], deadline, null);
      if (outcome!.ok) continue;
      const refused = refusalOf(outcome!.error);
      if (refused !== null) throw this.#refused(messages[i]!, refused, outcome!.error);
      throw this.#publishError(messages[i]!, outcome!.error, i, messages.length);
    }
  }

  /**
   * Publishes the messages back to back and waits for every PubAck, or for
   * the deadline. Each message after the first expects the one before it as
   * the stream's last message id, and the first expects `expectFirst` when given.
   */
  async #sendAll(session: Session, messages: readonly WireText[], deadline: number, expectFirst: string | null): Promise<PubAckOutcome[]> {
    const outgoing = messages.map((m, i) => ({
      subject: `${this.#options.subjectPrefix}.${m.type}`,
      body: m.body,
      headers: this.#headersOf(m, i > 0 ? messages[i - 1]!.id : expectFirst),
    }));
    const sent = session.acks.publishAll(outgoing);
    const timer = setTimeout(() => session.acks.expire(sent.from, sent.to, this.#options.ackTimeoutMs), Math.max(1, deadline - Date.now()));
    try {
      return await sent.outcomes;
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * The message's NATS headers as their wire text, written here in one go: the
   * client's header API (a map per message, `append` checking each name, the
   * text built and encoded on publish) cost about a tenth of the relay's CPU.
   * The names are fixed ones; the values are checked as the client would: a
   * value with a line break cannot travel as a NATS header (the batch could
   * never go out), so it is left out and the body carries it; the others are
   * trimmed. The id and the stream name hold no line break (ids are the
   * outbox's, the stream's name is validated).
   */
  #headersOf(m: WireText, expectedLastId: string | null): string {
    let text = 'NATS/1.0';
    for (const name in m.headers) {
      const value = m.headers[name]!;
      if (!LINE_BREAK.test(value)) text += `\r\n${name}: ${value.trim()}`;
    }
    text += `\r\ncontent-type: ${m.contentType}\r\nNats-Msg-Id: ${m.id}\r\nNats-Expected-Stream: ${this.#options.stream}`;
    if (expectedLastId !== null) text += `\r\nNats-Expected-Last-Msg-Id: ${expectedLastId}`;
    return `${text}\r\n\r\n`;
  }

  /** The event refused for good, with where it was going (kept with the parked event). */
  #refused(m: WireText, refusal: string, cause: unknown): RefusedEventError {
    return new RefusedEventError(m.id, `nats: ${refusal}; stream ${this.#options.stream}, subject ${this.#options.subjectPrefix}.${m.type}`, { cause });
  }

  #publishError(m: WireText, error: unknown, index: number, count: number): Error {
    const subject = `${this.#options.subjectPrefix}.${m.type}`;
    const where = `event ${index + 1} of ${count} (id ${m.id}, subject ${subject}) to stream ${this.#options.stream} on ${describeServers(this.#options.servers)}`;
    if (isTimeout(error)) {
      return new Error(`nats: no PubAck for ${where} within the ackTimeout of ${this.#options.ackTimeoutMs} ms; the server is stalled or overloaded (the relay retries the batch)`, { cause: error });
    }
    if (error instanceof NoStreamError) {
      return new Error(`nats: no stream captures ${where}: check that the stream exists and that its subjects include '${this.#options.subjectPrefix}.>', and that JetStream is enabled`, { cause: error });
    }
    return new Error(`nats: publishing ${where} failed: ${reason(error)}`, { cause: error });
  }

  /**
   * Connects and makes sure the stream exists (declaring it, with a
   * duplicate window covering the relay's republish horizon, unless
   * `declare: false`), so a `natsSource` can start once `relay.start()`
   * resolves. The relay calls it at start; `publish` does the same when needed.
   */
  async start(context: TargetCheckContext): Promise<void> {
    this.#horizonMs = Math.max(this.#horizonMs, context.republishHorizonMs);
    await this.#connected();
  }

  /** The open session, or a new one (connected, stream declared). */
  #connected(): Promise<Session> {
    if (this.#session && !this.#session.nc.isClosed()) return Promise.resolve(this.#session);
    this.#session = null;
    this.#connecting ??= this.#open().finally(() => (this.#connecting = null));
    return this.#connecting;
  }

  async #open(): Promise<Session> {
    const nc = await openConnection(this.#options.servers, `mailroom relay ${this.name}`);
    try {
      const jsm = await jetstreamManager(nc);
      await ensureStream(jsm, this.#options, Math.max(MIN_DUPLICATE_WINDOW_MS, this.#horizonMs));
      const session = { nc, jsm, acks: new PubAckInbox(nc) };
      this.#session = session;
      void nc.closed().then(() => {
        if (this.#session === session) this.#session = null;
      });
      return session;
    } catch (error) {
      await closeQuietly(nc);
      if (error instanceof Error && error.message.startsWith('nats:')) throw error;
      throw new Error(`nats: cannot use JetStream on ${describeServers(this.#options.servers)}: ${reason(error)}; is the server started with -js?`, { cause: error });
    }
  }

  #drop(session: Session): void {
    if (this.#session === session) this.#session = null;
    void closeQuietly(session.nc);
  }

  /**
   * The stream's settings that break a guarantee (`nats-stream-missing`,
   * `nats-duplicate-window`, `nats-memory-storage`). Also remembers the
   * relay's republish horizon: a stream this target declares later gets a
   * duplicate window covering it.
   */
  async check(context: TargetCheckContext): Promise<SafetyWarning[]> {
    this.#horizonMs = Math.max(this.#horizonMs, context.republishHorizonMs);
    const nc = this.#session && !this.#session.nc.isClosed() ? null : await openConnection(this.#options.servers, `mailroom check ${this.name}`);
    try {
      const jsm = nc ? await jetstreamManager(nc) : this.#session!.jsm;
      const info = await streamInfoOrNull(jsm, this.#options.stream);
      const serverMaxPayload = (nc ?? this.#session!.nc).info?.max_payload;
      return targetWarnings(info, this.#options, context.republishHorizonMs, this.#subject, { maxPayloadBytes: context.maxPayloadBytes, serverMaxPayload });
    } finally {
      await closeQuietly(nc);
    }
  }

  /** Closes the connection; a later publish opens a new one. */
  async close(): Promise<void> {
    const session = this.#session;
    this.#session = null;
    const connecting = this.#connecting;
    await closeQuietly(session?.nc ?? null);
    if (connecting) await connecting.then((s) => closeQuietly(s.nc), () => undefined);
  }
}

/**
 * Why the server or the client refuses a message for good (it would be
 * refused on every retry), or null for a failure worth retrying.
 */
function refusalOf(error: unknown): string | null {
  if (error instanceof PubAckError && error.errCode === MESSAGE_TOO_LARGE) return `the stream refuses the message as larger than its max_msg_size (${error.message})`;
  if (error instanceof Error && error.name === 'InvalidArgumentError' && /max_payload/.test(error.message)) {
    return `the message is larger than the server's max_payload (${error.message}); raise max_payload or lower mailroom's maxPayloadBytes`;
  }
  return null;
}

function isTimeout(error: unknown): boolean {
  return error instanceof Error && (error.name === 'TimeoutError' || (error.cause instanceof Error && error.cause.name === 'TimeoutError'));
}

/**
 * A relay target publishing outbox events to a NATS JetStream stream: subject
 * `<subjectPrefix>.<event type>`, the event id as `Nats-Msg-Id` (deduplicated
 * by the stream), the CloudEvents JSON as body, `content-type` and the tracing
 * headers as NATS headers. Creates the stream when the relay starts (or on
 * first use) unless `declare: false`.
 *
 * @example
 * import { nats } from 'mailroom/nats';
 * const relay = mailroom.relay({ to: [nats({ url: 'nats://127.0.0.1:4222', stream: 'orders' })] });
 */
export function nats(options: NatsTargetOptions): NatsTarget {
  return new NatsTarget(options);
}
