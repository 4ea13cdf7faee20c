/**
 * The RabbitMQ relay target: publishes each batch on a confirm channel, in
 * outbox order, and resolves only when RabbitMQ confirmed every event.
 */
import type { ChannelModel, ConfirmChannel, Message, Options } from 'amqplib';
import type { SafetyWarning, TargetCheckContext } from '../safety.ts';
import { wireMessageOf } from '../wire.ts';
import { RefusedEventError } from '../../relay/refused.ts';
import { storedRowOf } from '../../relay/stored-event.ts';
import type { RelayContext, RelayedEvent, RelayTarget } from '../../relay/target.ts';
import { checkInconclusive, exchangeMissing, exists, limitDrops, noDeliveryLimit, probeRetryLimit, queueMissing } from './check.ts';
import { amqpCode, closeQuietly, openConnection, serverText, SETUP_TIMEOUT_MS, withTimeout } from './connection.ts';
import { redactUrl, resolveTargetOptions, type RabbitMqTargetOptions, type ResolvedTargetOptions } from './options.ts';

/** A relay target publishing to a RabbitMQ exchange (see `rabbitmq()`). */
export interface RabbitMqTarget extends RelayTarget {
  /** Events RabbitMQ confirmed but dropped because no queue was bound for their routing key (with `unroutable: 'warn'`). */
  readonly unroutableCount: number;
  /** `rabbitmq-exchange-missing`, and for `checkQueues`: `rabbitmq-no-delivery-limit`, `rabbitmq-queue-missing`, `rabbitmq-check-inconclusive`. */
  check(context?: TargetCheckContext): Promise<SafetyWarning[]>;
  /** Closes the connection; a later publish opens a new one. */
  close(): Promise<void>;
}

/** One open connection with its confirm channel. */
interface Link {
  readonly connection: ChannelModel;
  readonly channel: ConfirmChannel;
  /** Message id -> routing key of messages RabbitMQ returned as unroutable (basic.return comes before their confirm). */
  readonly returned: Map<string, string>;
  /** Why the channel or connection closed, when RabbitMQ said. */
  error: Error | null;
  closed: boolean;
  readonly onClose: Set<() => void>;
}

const PRECONDITION_FAILED = 406;

class RabbitMqRelayTarget implements RabbitMqTarget {
  readonly name: string;
  /** Publishes without the relay's transaction: the relay reads the next batch while this one is confirmed. */
  readonly readAhead = true;
  private readonly options: ResolvedTargetOptions;
  private link: Link | null = null;
  private connecting: Promise<Link> | null = null;
  /** Publishes run one at a time, so batches never interleave on the wire. */
  private queue: Promise<unknown> = Promise.resolve();
  private generation = 0;
  private unroutable = 0;
  private readonly warnedKeys = new Set<string>();

  constructor(options: ResolvedTargetOptions) {
    this.options = options;
    this.name = options.name;
  }

  get unroutableCount(): number {
    return this.unroutable;
  }

  publish(events: readonly RelayedEvent[], _context?: RelayContext): Promise<void> {
    const run = this.queue.then(() => this.publishBatch(events));
    this.queue = run.catch(() => {});
    return run;
  }

  private async publishBatch(events: readonly RelayedEvent[]): Promise<void> {
    if (events.length === 0) return;
    const { exchange, confirmTimeoutMs } = this.options;
    const messages = events.map((event) => this.encode(event));
    const link = await this.connect();
    link.returned.clear();
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        reject(
          new Error(
            `rabbitmq: no publisher confirm from ${redactUrl(this.options.url)} for a batch of ${events.length} events to exchange '${exchange}' ` +
              `within ${confirmTimeoutMs} ms (a blocked or overloaded broker: check its memory and disk alarms); the relay retries the batch`,
          ),
        );
      }, confirmTimeoutMs);
    });
    const confirmed = this.send(link, messages);
    confirmed.catch(() => {});
    try {
      await Promise.race([confirmed, timeout]);
    } catch (error) {
      this.drop(link);
      throw this.refusal(link, messages) ?? error;
    } finally {
      clearTimeout(timer);
    }
    this.handleReturned(link, messages);
  }

  private encode(event: RelayedEvent): { id: string; routingKey: string; body: Buffer; properties: Options.Publish } {
    const wire = wireMessageOf(event);
    const routingKey = this.options.routingKey ? this.options.routingKey(event.envelope) : wire.type;
    if (typeof routingKey !== 'string' || Buffer.byteLength(routingKey, 'utf8') > 255) {
      throw new Error(`rabbitmq: routingKey(envelope) must return a string of at most 255 bytes; for event ${wire.id} it returned ${JSON.stringify(routingKey)}`);
    }
    const { time: sent, correlation_id: correlationId } = storedRowOf(event);
    const time = Date.parse(sent);
    const properties: Options.Publish = {
      persistent: true,
      mandatory: true,
      messageId: wire.id,
      contentType: wire.contentType,
      type: wire.type,
      headers: { ...wire.headers },
    };
    if (Number.isFinite(time)) properties.timestamp = Math.floor(time / 1000);
    if (correlationId !== null) properties.correlationId = correlationId;
    return { id: wire.id, routingKey, body: wire.body, properties };
  }

  /** Publishes the messages in order and resolves when every one is confirmed. */
  private async send(link: Link, messages: ReturnType<RabbitMqRelayTarget['encode']>[]): Promise<void> {
    const { exchange } = this.options;
    const confirms: Promise<void>[] = [];
    for (const m of messages) {
      if (link.closed) break;
      let writable = true;
      confirms.push(
        new Promise<void>((resolve, reject) => {
          try {
            writable = link.channel.publish(exchange, m.routingKey, m.body, m.properties, (err: unknown) => {
              if (err === null || err === undefined) resolve();
              else reject(this.confirmError(link, m.id, err));
            });
          } catch (error) {
            reject(this.confirmError(link, m.id, error));
          }
        }),
      );
      if (!writable) await waitForDrain(link);
    }
    if (link.closed && confirms.length < messages.length) {
      confirms.push(Promise.reject(this.confirmError(link, messages[confirms.length]!.id, new Error('channel closed'))));
    }
    await Promise.all(confirms);
  }

  private confirmError(link: Link, id: string, error: unknown): Error {
    const reason = error instanceof Error ? error.message : String(error);
    if (/nack/i.test(reason)) {
      return new Error(
        `rabbitmq: RabbitMQ refused event ${id} (publisher nack) on exchange '${this.options.exchange}': a queue it routes to refused it ` +
          `(e.g. a full queue with x-overflow reject-publish) or failed to store it; the relay retries the batch`,
        { cause: error },
      );
    }
    const why = link.error ? serverText(link.error) : reason;
    let hint = 'the relay retries the batch on a new connection';
    if (amqpCode(link.error) === 404) hint = `the exchange '${this.options.exchange}' does not exist: create it, or let the target declare it (declare: true)`;
    return new Error(`rabbitmq: the channel to ${redactUrl(this.options.url)} closed before RabbitMQ confirmed event ${id} (${why}); ${hint}`, { cause: link.error ?? error });
  }

  /**
   * The event RabbitMQ can never take, when the channel closed because one of
   * the batch was larger than its `max_message_size`: the relay parks that one
   * and publishes the rest again, instead of retrying the batch forever.
   */
  private refusal(link: Link, messages: ReturnType<RabbitMqRelayTarget['encode']>[]): RefusedEventError | null {
    if (amqpCode(link.error) !== PRECONDITION_FAILED) return null;
    const text = serverText(link.error);
    const tooLarge = /message size (\d+) is larger than configured max size (\d+)/.exec(text);
    if (!tooLarge) return null;
    const size = Number(tooLarge[1]);
    const max = Number(tooLarge[2]);
    const m = messages.find((x) => x.body.length === size) ?? messages.find((x) => x.body.length > max);
    if (!m) return null;
    return new RefusedEventError(
      m.id,
      `rabbitmq: its message of ${m.body.length} bytes is larger than the broker's max_message_size (${max} bytes); exchange '${this.options.exchange}', routing key '${m.routingKey}'`,
      { cause: link.error },
    );
  }

  private handleReturned(link: Link, messages: ReturnType<RabbitMqRelayTarget['encode']>[]): void {
    if (link.returned.size === 0) return;
    const keys = new Map<string, number>();
    for (const m of messages) {
      if (!link.returned.has(m.id)) continue;
      keys.set(m.routingKey, (keys.get(m.routingKey) ?? 0) + 1);
    }
    link.returned.clear();
    const count = [...keys.values()].reduce((a, b) => a + b, 0);
    if (count === 0) return;
    const list = [...keys.keys()].map((k) => `'${k}'`).join(', ');
    if (this.options.unroutable === 'fail') {
      throw new Error(
        `rabbitmq: ${count} of ${messages.length} events were unroutable on exchange '${this.options.exchange}' (no queue bound for routing key ${list}); ` +
          `RabbitMQ dropped them. Bind a queue for these keys; the relay retries the batch (unroutable: 'fail')`,
      );
    }
    this.unroutable += count;
    for (const key of keys.keys()) {
      if (this.warnedKeys.has(key)) continue;
      this.warnedKeys.add(key);
      console.warn(
        `mailroom rabbitmq target ${this.name}: events with routing key '${key}' are unroutable on exchange '${this.options.exchange}' ` +
          `(no queue is bound for it), so RabbitMQ drops them. Bind a queue for the key, or use unroutable: 'fail' to hold them in the outbox. ` +
          `(Warned once per routing key; unroutableCount counts them.)`,
      );
    }
  }

  private async connect(): Promise<Link> {
    if (this.link !== null && !this.link.closed) return this.link;
    this.connecting ??= this.open().finally(() => {
      this.connecting = null;
    });
    return await this.connecting;
  }

  private async open(): Promise<Link> {
    const generation = this.generation;
    const { url } = this.options;
    const connection = await openConnection(url, `relay target ${this.name}`);
    try {
      const link = await withTimeout(this.setUp(connection), SETUP_TIMEOUT_MS, `opening a confirm channel on ${redactUrl(url)}`);
      if (generation !== this.generation) throw new Error(`rabbitmq: target ${this.name} was closed while connecting`);
      if (link.closed) throw new Error(`rabbitmq: the connection to ${redactUrl(url)} closed while opening the confirm channel`);
      this.link = link;
      return link;
    } catch (error) {
      await closeQuietly(connection);
      throw error;
    }
  }

  private async setUp(connection: ChannelModel): Promise<Link> {
    const { url, exchange, declare } = this.options;
    const channel = await connection.createConfirmChannel();
    const link: Link = { connection, channel, returned: new Map(), error: null, closed: false, onClose: new Set() };
    const lost = (error?: Error) => {
      if (error && link.error === null) link.error = error;
      if (link.closed) return;
      link.closed = true;
      for (const f of link.onClose) f();
      link.onClose.clear();
      void closeQuietly(connection);
    };
    channel.on('error', (error: Error) => {
      link.error ??= error;
    });
    channel.on('close', () => lost());
    connection.on('close', (error?: Error) => lost(error));
    channel.on('return', (message: Message) => {
      const id: unknown = message.properties.messageId;
      if (typeof id === 'string') link.returned.set(id, message.fields.routingKey);
    });
    if (declare) {
      try {
        await channel.assertExchange(exchange, 'topic', { durable: true });
      } catch (error) {
        if (amqpCode(error) === PRECONDITION_FAILED) {
          throw new Error(
            `rabbitmq: the exchange '${exchange}' exists with other settings than a durable topic exchange (${serverText(error)}); ` +
              `publish to it as it is with declare: false, or delete it so the target can declare it`,
            { cause: error },
          );
        }
        throw new Error(`rabbitmq: cannot declare the exchange '${exchange}' on ${redactUrl(url)}: ${serverText(error)}`, { cause: error });
      }
    }
    return link;
  }

  /** Forgets a link that failed (its connection is closed in the background). */
  private drop(link: Link): void {
    if (this.link === link) this.link = null;
    link.closed = true;
    for (const f of link.onClose) f();
    link.onClose.clear();
    void closeQuietly(link.connection, 500);
  }

  async check(_context?: TargetCheckContext): Promise<SafetyWarning[]> {
    const { url, exchange, declare, checkQueues } = this.options;
    const warnings: SafetyWarning[] = [];
    const connection = await openConnection(url, `relay target ${this.name} check`);
    try {
      if (!declare && !(await exists(connection, 'exchange', exchange))) warnings.push(exchangeMissing(url, exchange));
      for (const queue of checkQueues) {
        const limit = await probeRetryLimit(connection, queue);
        if (limit.kind === 'missing') warnings.push(queueMissing(url, queue, 'checkQueues'));
        else if (limit.kind === 'unlimited') warnings.push(noDeliveryLimit(url, queue));
        else if (limit.kind === 'drops') warnings.push(limitDrops(url, queue, limit));
        else if (limit.kind === 'unknown') warnings.push(checkInconclusive(url, queue, limit.reason));
      }
    } finally {
      await closeQuietly(connection);
    }
    return warnings;
  }

  async close(): Promise<void> {
    this.generation++;
    const link = this.link;
    this.link = null;
    await this.connecting?.catch(() => {});
    if (link !== null) {
      link.closed = true;
      for (const f of link.onClose) f();
      link.onClose.clear();
      await closeQuietly(link.connection);
    }
  }
}

function waitForDrain(link: Link): Promise<void> {
  if (link.closed) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const done = () => {
      link.channel.off('drain', done);
      link.onClose.delete(done);
      resolve();
    };
    link.channel.on('drain', done);
    link.onClose.add(done);
  });
}

/**
 * A relay target that publishes events to a RabbitMQ exchange with publisher
 * confirms: persistent messages, the event id as `messageId`, the event type
 * as routing key, CloudEvents structured JSON as the body. Declares a durable
 * topic exchange unless `declare: false`.
 *
 * @example
 * import { rabbitmq } from 'mailroom/rabbitmq';
 * const relay = mailroom.relay({ to: [rabbitmq({ url: process.env.RABBITMQ_URL!, exchange: 'events' })] });
 */
export function rabbitmq(options: RabbitMqTargetOptions): RabbitMqTarget {
  return new RabbitMqRelayTarget(resolveTargetOptions(options));
}
