/**
 * Publishing to JetStream without a request per message: each message is a
 * plain publish whose reply subject is this connection's ack inbox plus a
 * number, and one subscription on the inbox hands each PubAck to the message
 * that waits for it. The stream's answer is the same as for the client's
 * `js.publish()` (the PubAck, or its error); the client's per-request
 * machinery (a request object, a timer and an error made per message) is not
 * paid. The JetStream headers (`Nats-Msg-Id`, `Nats-Expected-Stream`,
 * `Nats-Expected-Last-Msg-Id`) are set by the caller.
 */
import { createInbox, type Msg, type MsgHdrs, type NatsConnection } from '@nats-io/transport-node';

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

/**
 * One connection's ack inbox. Made when the connection opens; every outcome
 * still waiting fails when the connection closes.
 *
 * @example
 * const acks = new PubAckInbox(nc);
 * const outcome = acks.publish('orders.order.placed', body, headers);
 */
export class PubAckInbox {
  readonly #nc: NatsConnection;
  readonly #prefix = createInbox();
  readonly #waiting = new Map<number, (outcome: PubAckOutcome) => void>();
  #next = 0;

  constructor(nc: NatsConnection) {
    this.#nc = nc;
    // Ends with the connection: the target never closes it on its own.
    nc.subscribe(`${this.#prefix}.*`, {
      callback: (error, msg) => (error ? this.#failAll(error) : this.#answer(msg)),
    });
    void nc.closed().then((error) => this.#failAll(error ?? new Error('the connection closed')));
  }

  /** Publishes one message; `outcome` resolves with the stream's answer (see {@link expire} for a deadline). */
  publish(subject: string, body: Uint8Array, headers: MsgHdrs): { outcome: Promise<PubAckOutcome>; number: number } {
    const number = this.#next++;
    const outcome = new Promise<PubAckOutcome>((resolve) => this.#waiting.set(number, resolve));
    try {
      this.#nc.publish(subject, body, { headers, reply: `${this.#prefix}.${number}` });
    } catch (error) {
      this.#settle(number, { ok: false, error: error instanceof Error ? error : new Error(String(error)) });
    }
    return { outcome, number };
  }

  /** Fails the messages numbered `from` to `to` (inclusive) still waiting: their time is up. */
  expire(from: number, to: number, timeoutMs: number): void {
    for (let n = from; n <= to; n++) if (this.#waiting.has(n)) this.#settle(n, { ok: false, error: new PubAckTimeoutError(timeoutMs) });
  }

  /** Fails every message still waiting (the subscription or the connection ended). */
  #failAll(error: Error): void {
    for (const n of [...this.#waiting.keys()]) this.#settle(n, { ok: false, error });
  }

  #settle(number: number, outcome: PubAckOutcome): void {
    const resolve = this.#waiting.get(number);
    if (!resolve) return;
    this.#waiting.delete(number);
    resolve(outcome);
  }

  #answer(msg: Msg): void {
    const number = Number(msg.subject.slice(this.#prefix.length + 1));
    if (!this.#waiting.has(number)) return; // expired, or not ours
    if (msg.headers?.hasError) {
      const error = msg.headers.code === 503 ? new NoStreamError() : new PubAckError(msg.headers.code, 0, msg.headers.description || `status ${msg.headers.code}`);
      this.#settle(number, { ok: false, error });
      return;
    }
    // A PubAck of a stored message, with its sequence and no error, is all the relay needs: such an
    // answer is not decoded and parsed (3-4 % of the relay's CPU went there). Anything else is parsed.
    const data = Buffer.from(msg.data.buffer, msg.data.byteOffset, msg.data.byteLength);
    if (data.subarray(0, PUBACK_START.length).equals(PUBACK_START) && data.indexOf(SEQ_FIELD) !== -1 && data.indexOf(ERROR_FIELD) === -1) {
      this.#settle(number, OK);
      return;
    }
    let ack: PubAckBody;
    try {
      ack = msg.json<PubAckBody>();
    } catch (error) {
      this.#settle(number, { ok: false, error: new Error(`an answer that is no PubAck: ${msg.string().slice(0, 200)}`, { cause: error }) });
      return;
    }
    if (ack.error) {
      this.#settle(number, { ok: false, error: new PubAckError(ack.error.code ?? 0, ack.error.err_code ?? 0, ack.error.description ?? 'refused') });
    } else if (typeof ack.seq !== 'number') {
      // Not the stream's answer (something else answered on the subject): the message is not known to be stored.
      this.#settle(number, { ok: false, error: new Error(`an answer that is no PubAck (no sequence): ${msg.string().slice(0, 200)}`) });
    } else {
      this.#settle(number, OK);
    }
  }
}
