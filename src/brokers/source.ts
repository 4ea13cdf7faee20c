/**
 * The seam between a consumer group and a broker: a source hands messages to
 * mailroom one at a time; mailroom stores them (as jobs of the group, or as
 * dead letters) and only then calls `ack`. Adapters (`mailroom/rabbitmq`,
 * `mailroom/nats`, `mailroom/redis`) implement it; so can you.
 */
import type { SafetyWarning } from './safety.ts';

/**
 * The built-in sources' default `prefetch`: messages delivered and not yet
 * acknowledged at most. The broker sends more only after mailroom stored and
 * acknowledged a batch, so this bounds how fast a group takes a backlog: 30,000
 * keyed events were stored at 4.4-6.6k/s with 100 and 7.0-8.0k/s with 250 on
 * the 2-core machine here (docs/BENCHMARKS.md, session 22). The messages in
 * hand cost memory: lower it for large messages.
 */
export const DEFAULT_SOURCE_PREFETCH = 250;

/** One message as a source delivers it. */
export interface SourceMessage {
  /** The raw body (a CloudEvents 1.0 structured JSON document, or the data of a binary-mode event). */
  readonly body: Uint8Array | string;
  /** The broker's own message id, when it has one (AMQP `message_id`, `Nats-Msg-Id`, the stream entry's `id` field). */
  readonly messageId?: string | null;
  /** Transport headers with string values (binary-mode `ce-*` attributes, `content-type`, `traceparent`, …). */
  readonly headers?: Readonly<Record<string, string>>;
  /** Where it came from, for dead letters and logs: e.g. `rabbitmq queue billing, delivery 17`. */
  readonly origin: string;
  /**
   * Tells the broker the message is done with. Called once, after mailroom has
   * durably stored the message. Must not throw when the connection it came on
   * is gone (the broker redelivers it; mailroom deduplicates it).
   */
  ack(): void | Promise<void>;
  /**
   * Gives the message back for redelivery. Called only for messages mailroom
   * could not store by the time it stops. Must not throw when the connection is gone.
   */
  nack(): void | Promise<void>;
}

/** What mailroom gives a source when it starts it. */
export interface SourceContext {
  /** The consumer group (e.g. to name a durable consumer or a stream consumer group). */
  readonly group: string;
  /** The group's handler timeout, if it has one (a source whose broker has an ack deadline may align to it). */
  readonly handlerTimeoutMs: number | null;
  /** Reports trouble the source recovers from on its own (a lost connection, a reconnect). */
  report(error: unknown): void;
  /** Reports a broker setting that breaks a guarantee (also returned by `check()`). */
  warn(warning: SafetyWarning): void;
}

/**
 * A broker subscription a consumer group reads from. `start` begins calling
 * `deliver` for each message and keeps at most its prefetch of delivered,
 * unacknowledged messages; it reconnects on its own after a broker restart.
 * `stop` stops delivering and closes what `start` opened; messages delivered
 * and not yet acknowledged go back to the broker.
 *
 * @example
 * const billing = mailroom.consumer({ group: 'billing', source: rabbitmqSource({ url, queue: 'billing' }), handlers });
 */
export interface ConsumerSource {
  /** The transport, for logs and stats: `rabbitmq`, `nats`, `redis`, or your own. */
  readonly kind: string;
  /** What it reads, for logs and stats: a queue, stream or durable name. */
  readonly name: string;
  start(deliver: (message: SourceMessage) => void, context: SourceContext): Promise<void>;
  stop(): Promise<void>;
  /**
   * Broker settings that break a guarantee (checked at start and by `mailroom
   * doctor`). `context` says which group the source is for, so a source that
   * has not been started can check what that group would use.
   */
  check?(context?: SourceCheckContext): Promise<SafetyWarning[]>;
  /**
   * Deletes what the broker keeps for the group: its queue (RabbitMQ), its
   * durable consumer (NATS) or its stream consumer group (Redis), with the
   * messages not yet taken. Called by `consumerGroups.remove(group, { source })`
   * after the group left the database; resolves with what it did, for people.
   * Refuses while the source runs.
   */
  remove?(context: SourceRemoveContext): Promise<string>;
}

/** What a source's `remove()` is told. */
export interface SourceRemoveContext {
  /** The consumer group being removed (names a durable consumer or stream group when the source's options do not). */
  readonly group: string;
}

/** What a source's `check()` is told about the consumer group reading it. */
export interface SourceCheckContext {
  /** The consumer group (names a durable consumer or stream group when the source's options do not). */
  readonly group: string;
  /** The group's handler timeout, if it has one. */
  readonly handlerTimeoutMs: number | null;
}
