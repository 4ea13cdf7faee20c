/**
 * Publishing to JetStream without a request per message: each message is a
 * plain publish whose reply subject is this connection's ack inbox plus a
 * number, and one subscription on the inbox hands each PubAck to the message
 * that waits for it. The stream's answer is the same as for the client's
 * `js.publish()` (the PubAck, or its error); the client's per-request
 * machinery (a request object, a timer and an error made per message) is not
 * paid. The JetStream headers (`Nats-Msg-Id`, `Nats-Expected-Stream`,
 * `Nats-Expected-Last-Msg-Id`) are set by the caller, as header text.
 *
 * A batch goes out as one buffer of `HPUB` frames written here, handed to
 * the client's protocol layer (which sends it as is, or holds it while the
 * client reconnects, as it does its own frames). The client's `publish()`
 * built each message's command line and encoded it, checked the subjects
 * and copied every part once more into its buffer; the relay to NATS spent
 * 9-30 % more Node CPU that way (docs/BENCHMARKS.md, session 49). A
 * client without that layer gets each message through `publish()`, as before.
 */
import { createInbox, type Msg, type NatsConnection } from '@nats-io/transport-node';
import { EncodedHeaders } from './encoded-headers.ts';

/** What the stream answered for one message. */
export type PubAckOutcome = { ok: true } | { ok: false; error: Error };

const OK: PubAckOutcome = { ok: true };

/** How a PubAck without an error starts (the server writes its fields in this order; an error comes first). */
const PUBACK_START = Buffer.from('{"stream":');
/** Found in every PubAck that carries an error, and in no other (a quote inside a name is escaped). */
const ERROR_FIELD = Buffer.from('"error"');
/** Found in every PubAck that stored (or deduplicated) the message. */
const SEQ_FIELD = Buffer.from('"seq":');

/** The stream refused a message: its PubAck carried an error (`errCode` is JetStream's, e.g. 10070). */
export class PubAckError extends Error {
  constructor(
    readonly code: number,
    readonly errCode: number,
    description: string,
  ) {
    super(description);
    this.name = 'PubAckError';
  }
}

/** Nothing answered the message: no stream captures its subject (or JetStream is off). */
export class NoStreamError extends Error {
  constructor() {
    super('no responders: no stream captures the subject');
    this.name = 'NoStreamError';
  }
}

/** No PubAck came within the time given. */
export class PubAckTimeoutError extends Error {
  constructor(ms: number) {
    super(`no PubAck within ${ms} ms`);
    this.name = 'TimeoutError';
  }
}

interface PubAckBody {
  seq?: unknown;
  error?: { code?: number; err_code?: number; description?: string };
}

/** One message to publish through the inbox. */
export interface OutgoingMessage {
  /** A literal subject (no wildcards or spaces: the caller's checks). */
  readonly subject: string;
  /** The body: text is sent as UTF-8. */
  readonly body: string | Uint8Array;
  /** The headers' wire text: `NATS/1.0\r\nName: value\r\n...\r\n\r\n`. */
  readonly headers: string;
}

/** The part of the client's protocol layer a batch is written through: it sends (or, while reconnecting, holds) the bytes as they are. */
interface FrameSink {
  sendCommand(frames: Uint8Array): void;
}

/** The connection's protocol layer, when the client has one that takes written frames (nats.js 3.x). */
function frameSinkOf(nc: NatsConnection): FrameSink | null {
  const protocol = (nc as unknown as { protocol?: { sendCommand?: unknown } }).protocol;
  return protocol && typeof protocol.sendCommand === 'function' ? (protocol as FrameSink) : null;
}

/** The client's error for a message over the server's `max_payload` (the target refuses such an event for good). */
function tooLarge(bytes: number, maxPayload: number): Error {
  const error = new Error(`payload max_payload size exceeded: ${bytes} bytes, the server takes ${maxPayload}`);
  error.name = 'InvalidArgumentError';
  return error;
}

/** Messages published together: numbered `from` to `to` (inclusive), answered together. */
export interface SentMessages {
  /** Each message's answer, in the order given; resolves once every one has its answer (see {@link PubAckInbox.expire}). */
  readonly outcomes: Promise<PubAckOutcome[]>;
  readonly from: number;
  readonly to: number;
}

/** Messages waiting for their answers: one promise for all of them, not one per message. */
interface Waiting {
  readonly from: number;
  readonly outcomes: (PubAckOutcome | undefined)[];
  left: number;
  readonly resolve: (outcomes: PubAckOutcome[]) => void;
}

/**
 * One connection's ack inbox. Made when the connection opens; every outcome
 * still waiting fails when the connection closes.
 *
 * @example
 * const acks = new PubAckInbox(nc);
 * const headers = 'NATS/1.0\r\nNats-Msg-Id: 0190…\r\n\r\n';
 * const sent = acks.publishAll([{ subject: 'orders.order.placed', body: '{"n":1}', headers }]);
 * const [outcome] = await sent.outcomes;
 */
export class PubAckInbox {
  readonly #nc: NatsConnection;
  readonly #sink: FrameSink | null;
  readonly #prefix = createInbox();
  /** In number order; a few at most (the batches in flight). */
  readonly #waiting: Waiting[] = [];
  #next = 0;

  constructor(nc: NatsConnection) {
    this.#nc = nc;
    this.#sink = frameSinkOf(nc);
    // Ends with the connection: the target never closes it on its own.
    nc.subscribe(`${this.#prefix}.*`, {
      callback: (error, msg) => (error ? this.#failAll(error) : this.#answer(msg)),
    });
    void nc.closed().then((error) => this.#failAll(error ?? new Error('the connection closed')));
  }

  /** True when batches go out as frames written here; false when each message goes through the client's `publish()`. */
  get writesFrames(): boolean {
    return this.#sink !== null;
  }

  /** Publishes the messages back to back on the connection; `outcomes` resolves with the stream's answers. */
  publishAll(messages: readonly OutgoingMessage[]): SentMessages {
    const from = this.#next;
    this.#next += messages.length;
    const to = from + messages.length - 1;
    if (messages.length === 0) return { outcomes: Promise.resolve([]), from, to };
    let resolve!: (outcomes: PubAckOutcome[]) => void;
    const outcomes = new Promise<PubAckOutcome[]>((r) => (resolve = r));
    this.#waiting.push({ from, outcomes: new Array<PubAckOutcome | undefined>(messages.length).fill(undefined), left: messages.length, resolve });
    if (this.#sink && !this.#nc.isClosed() && !this.#nc.isDraining()) this.#writeFrames(this.#sink, messages, from);
    else this.#publishEach(messages, from);
    return { outcomes, from, to };
  }

  /** Every message through the client's `publish()` (a closed connection's error settles each). */
  #publishEach(messages: readonly OutgoingMessage[], from: number): void {
    for (let i = 0; i < messages.length; i++) {
      const m = messages[i]!;
      try {
        this.#nc.publish(m.subject, m.body, { headers: new EncodedHeaders(m.headers), reply: `${this.#prefix}.${from + i}` });
      } catch (error) {
        this.#settle(from + i, { ok: false, error: error instanceof Error ? error : new Error(String(error)) });
      }
    }
  }

  /**
   * The messages as `HPUB <subject> <reply> <header bytes> <total bytes>` frames in one buffer, sized
   * first and then written. A message over the server's `max_payload` is left out and answered with the
   * client's error for it, as `publish()` would have thrown.
   */
  #writeFrames(sink: FrameSink, messages: readonly OutgoingMessage[], from: number): void {
    const maxPayload = this.#nc.info?.max_payload ?? Infinity;
    const lines: (string | null)[] = new Array<string | null>(messages.length);
    let size = 0;
    for (let i = 0; i < messages.length; i++) {
      const m = messages[i]!;
      const headerBytes = Buffer.byteLength(m.headers, 'utf8');
      const total = headerBytes + (typeof m.body === 'string' ? Buffer.byteLength(m.body, 'utf8') : m.body.byteLength);
      if (total > maxPayload) {
        lines[i] = null;
        this.#settle(from + i, { ok: false, error: tooLarge(total, maxPayload) });
        continue;
      }
      const line = `HPUB ${m.subject} ${this.#prefix}.${from + i} ${headerBytes} ${total}\r\n`;
      lines[i] = line;
      size += Buffer.byteLength(line, 'utf8') + total + 2;
    }
    if (size === 0) return;
    const frames = Buffer.allocUnsafe(size);
    let at = 0;
    for (let i = 0; i < messages.length; i++) {
      const line = lines[i];
      if (!line) continue; // over max_payload, answered already
      const m = messages[i]!;
      at += frames.write(line, at, 'utf8');
      at += frames.write(m.headers, at, 'utf8');
      if (typeof m.body === 'string') {
        at += frames.write(m.body, at, 'utf8');
      } else {
        frames.set(m.body, at);
        at += m.body.byteLength;
      }
      frames[at++] = 13; // \r
      frames[at++] = 10; // \n
    }
    sink.sendCommand(frames);
  }

  /** Fails the messages numbered `from` to `to` (inclusive) still waiting: their time is up. */
  expire(from: number, to: number, timeoutMs: number): void {
    const expired: PubAckOutcome = { ok: false, error: new PubAckTimeoutError(timeoutMs) };
    for (let n = from; n <= to; n++) this.#settle(n, expired);
  }

  /** Fails every message still waiting (the subscription or the connection ended). */
  #failAll(error: Error): void {
    const failed: PubAckOutcome = { ok: false, error };
    for (const w of [...this.#waiting]) for (let i = 0; i < w.outcomes.length; i++) this.#settle(w.from + i, failed);
  }

  /** The messages that `number` was published with, while its answer is awaited. */
  #waitingFor(number: number): Waiting | undefined {
    for (const w of this.#waiting) if (number >= w.from && number < w.from + w.outcomes.length) return w.outcomes[number - w.from] === undefined ? w : undefined;
    return undefined;
  }

  #settle(number: number, outcome: PubAckOutcome): void {
    const w = this.#waitingFor(number);
    if (w) this.#settleIn(w, number, outcome);
  }

  #settleIn(w: Waiting, number: number, outcome: PubAckOutcome): void {
    w.outcomes[number - w.from] = outcome;
    if (--w.left > 0) return;
    this.#waiting.splice(this.#waiting.indexOf(w), 1);
    w.resolve(w.outcomes as PubAckOutcome[]);
  }

  #answer(msg: Msg): void {
    const number = Number(msg.subject.slice(this.#prefix.length + 1));
    const w = this.#waitingFor(number);
    if (w) this.#settleIn(w, number, outcomeOf(msg)); // else expired, or not ours
  }
}

/** What a message's answer says: stored, or why not. */
function outcomeOf(msg: Msg): PubAckOutcome {
  if (msg.headers?.hasError) {
    const error = msg.headers.code === 503 ? new NoStreamError() : new PubAckError(msg.headers.code, 0, msg.headers.description || `status ${msg.headers.code}`);
    return { ok: false, error };
  }
  // A PubAck of a stored message, with its sequence and no error, is all the relay needs: such an
  // answer is not decoded and parsed (3-4 % of the relay's CPU went there). Anything else is parsed.
  const data = Buffer.from(msg.data.buffer, msg.data.byteOffset, msg.data.byteLength);
  if (data.subarray(0, PUBACK_START.length).equals(PUBACK_START) && data.indexOf(SEQ_FIELD) !== -1 && data.indexOf(ERROR_FIELD) === -1) return OK;
  let ack: PubAckBody;
  try {
    ack = msg.json<PubAckBody>();
  } catch (error) {
    return { ok: false, error: new Error(`an answer that is no PubAck: ${msg.string().slice(0, 200)}`, { cause: error }) };
  }
  if (ack.error) return { ok: false, error: new PubAckError(ack.error.code ?? 0, ack.error.err_code ?? 0, ack.error.description ?? 'refused') };
  // Not the stream's answer (something else answered on the subject): the message is not known to be stored.
  if (typeof ack.seq !== 'number') return { ok: false, error: new Error(`an answer that is no PubAck (no sequence): ${msg.string().slice(0, 200)}`) };
  return OK;
}
