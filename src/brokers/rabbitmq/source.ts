/**
 * The RabbitMQ consumer source: consumes a queue with manual acks and a
 * prefetch, hands each message to mailroom, and acks it once mailroom stored
 * it. Reconnects on its own after a broker restart or a lost connection.
 */
import type { Channel, ChannelModel, ConsumeMessage } from 'amqplib';
import type { SafetyWarning } from '../safety.ts';
import type { ConsumerSource, SourceContext, SourceMessage, SourceRemoveContext } from '../source.ts';
import { queueMissing, exists } from './check.ts';
import { amqpCode, closeChannelQuietly, closeQuietly, nextDelay, openChannel, openConnection, serverText, SETUP_TIMEOUT_MS, withTimeout } from './connection.ts';
import { Waker } from '../../worker/waker.ts';
import { ChannelAcks } from './channel-acks.ts';
import { redactUrl, resolveSourceOptions, type RabbitMqSourceOptions, type ResolvedSourceOptions } from './options.ts';

/** A consumer source reading a RabbitMQ queue (see `rabbitmqSource()`). */
export interface RabbitMqSource extends ConsumerSource {
  /** `rabbitmq-queue-missing` when there is no `declare` and the queue does not exist. */
  check(): Promise<SafetyWarning[]>;
  /** Deletes the queue with the messages in it, unless a consumer is attached (its bindings go with it). */
  remove(context: SourceRemoveContext): Promise<string>;
}

/** One connection with its consuming channel; messages ack on the session they came on. */
interface Session {
  readonly connection: ChannelModel;
  readonly channel: Channel;
  /** The channel's acks, sent together where they can be. */
  readonly acks: ChannelAcks;
  alive: boolean;
  /** Why it ended, as RabbitMQ or the socket said (a channel error, or the connection's). */
  reason: Error | null;
}

const NOT_FOUND = 404;
const PRECONDITION_FAILED = 406;

/**
 * Closes the channel first, so acks sent on it reach RabbitMQ before its
 * unacknowledged messages are returned, then the connection.
 */
async function closeSession(session: Session): Promise<void> {
  if (session.alive) {
    try {
      session.acks.flush();
    } catch {
      // closed already: RabbitMQ returns what was not acked
    }
  }
  session.alive = false;
  await withTimeout(session.channel.close(), 2000, 'closing the channel').catch(() => {});
  await closeQuietly(session.connection);
}

/** Transport headers as strings with lower-case names: AMQP headers plus `content-type`. */
function headersOf(message: ConsumeMessage): Record<string, string> {
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(message.properties.headers ?? {})) {
    let text: string | null = null;
    if (typeof value === 'string') text = value;
    else if (Buffer.isBuffer(value)) text = value.toString('utf8');
    else if (typeof value === 'number' || typeof value === 'bigint' || typeof value === 'boolean') text = String(value);
    if (text !== null) headers[name.toLowerCase()] = text;
  }
  const contentType: unknown = message.properties.contentType;
  if (typeof contentType === 'string' && headers['content-type'] === undefined) headers['content-type'] = contentType;
  return headers;
}

class RabbitMqConsumerSource implements RabbitMqSource {
  readonly kind = 'rabbitmq';
  readonly name: string;
  private readonly options: ResolvedSourceOptions;
  private state: 'idle' | 'running' | 'stopped' = 'idle';
  private session: Session | null = null;
  private deliver: ((message: SourceMessage) => void) | null = null;
  private context: SourceContext | null = null;
  private reconnecting: Promise<void> | null = null;
  private starting: Promise<void> | null = null;
  /** Cuts a reconnect backoff short when the source stops. */
  private readonly backoff = new Waker();

  constructor(options: ResolvedSourceOptions) {
    this.options = options;
    this.name = options.queue;
  }

  async start(deliver: (message: SourceMessage) => void, context: SourceContext): Promise<void> {
    if (this.state === 'running') throw new Error(`rabbitmq: the source for queue '${this.options.queue}' is already started; make one source per consumer`);
    this.state = 'running';
    this.deliver = deliver;
    this.context = context;
    this.starting = this.consume();
    try {
      await this.starting;
    } catch (error) {
      if (this.state === 'running') this.state = 'idle';
      throw error;
    } finally {
      this.starting = null;
    }
  }

  async stop(): Promise<void> {
    if (this.state !== 'running') {
      this.state = 'stopped';
      return;
    }
    this.state = 'stopped';
    this.backoff.poke();
    await this.starting?.catch(() => {});
    await this.reconnecting;
    const session = this.session;
    this.session = null;
    if (session !== null) await closeSession(session);
  }

  /**
   * Deletes the queue (with the messages it holds and its bindings), only
   * while no consumer is attached to it. Refuses while this source runs.
   */
  async remove(_context: SourceRemoveContext): Promise<string> {
    if (this.state === 'running') throw new Error(`rabbitmq: the source for queue '${this.options.queue}' is running; stop it before removing its queue`);
    const { url, queue } = this.options;
    const what = `rabbitmq queue ${queue} on ${redactUrl(url)}`;
    const connection = await openConnection(url, `consumer source ${queue} remove`);
    try {
      if (!(await exists(connection, 'queue', queue))) return `${what}: none to delete`;
      const channel = await openChannel(connection);
      try {
        // Quorum queues do not take delete's if-unused flag: the consumers are counted first instead.
        const { consumerCount } = await channel.checkQueue(queue);
        if (consumerCount > 0) throw new Error(`rabbitmq: ${what} still has ${consumerCount} consumer(s) attached; stop every consumer of it, then remove it`);
        const { messageCount } = await channel.deleteQueue(queue);
        return `${what} deleted with ${messageCount} message${messageCount === 1 ? '' : 's'} in it`;
      } finally {
        await closeChannelQuietly(channel);
      }
    } finally {
      await closeQuietly(connection);
    }
  }

  async check(): Promise<SafetyWarning[]> {
    if (this.options.declare !== null) return [];
    const { url, queue } = this.options;
    const connection = await openConnection(url, `consumer source ${queue} check`);
    try {
      return (await exists(connection, 'queue', queue)) ? [] : [queueMissing(url, queue, 'source')];
    } finally {
      await closeQuietly(connection);
    }
  }

  /** Connects, declares or checks, and consumes; the session is current once this resolves. */
  private async consume(): Promise<void> {
    const { url, queue } = this.options;
    const connection = await openConnection(url, `consumer source ${queue}`);
    try {
      const session = await withTimeout(this.setUp(connection), SETUP_TIMEOUT_MS, `setting up the consumer of queue '${queue}' on ${redactUrl(url)}`);
      if (this.state !== 'running') {
        await closeSession(session);
        return;
      }
      if (!session.alive) throw new Error(`rabbitmq: the connection to ${redactUrl(url)} closed while setting up the consumer of queue '${queue}'`);
      this.session = session;
    } catch (error) {
      await closeQuietly(connection);
      throw error;
    }
  }

  private async setUp(connection: ChannelModel): Promise<Session> {
    const { url, queue, prefetch, declare } = this.options;
    const channel = await openChannel(connection);
    await channel.prefetch(prefetch, false);
    if (declare !== null) {
      await this.declare(channel, declare);
    } else {
      try {
        await channel.checkQueue(queue);
      } catch (error) {
        if (amqpCode(error) === NOT_FOUND) {
          throw new Error(
            `rabbitmq: the queue '${queue}' does not exist on ${redactUrl(url)}; create it and bind it to the exchange the relay publishes to, ` +
              `or give the source declare: { exchange } to declare and bind it`,
            { cause: error },
          );
        }
        throw error;
      }
    }
    const session: Session = { connection, channel, acks: new ChannelAcks(channel), alive: true, reason: null };
    const because = (error?: Error) => {
      if (error instanceof Error) session.reason ??= error;
    };
    channel.on('error', because);
    connection.on('error', because);
    channel.on('close', () => this.lost(session));
    connection.on('close', (error?: Error) => {
      because(error);
      this.lost(session);
    });
    await channel.consume(queue, (message) => this.onMessage(session, message), { noAck: false });
    return session;
  }

  private async declare(channel: Channel, declare: NonNullable<ResolvedSourceOptions['declare']>): Promise<void> {
    const { queue } = this.options;
    try {
      await channel.assertExchange(declare.exchange, 'topic', { durable: true });
    } catch (error) {
      throw new Error(
        amqpCode(error) === PRECONDITION_FAILED
          ? `rabbitmq: the exchange '${declare.exchange}' exists but is not a durable topic exchange (${serverText(error)}); bind the queue yourself and drop declare, or fix the exchange`
          : `rabbitmq: cannot declare the exchange '${declare.exchange}': ${serverText(error)}`,
        { cause: error },
      );
    }
    try {
      await channel.assertQueue(queue, { durable: true, arguments: { 'x-queue-type': declare.type } });
    } catch (error) {
      throw new Error(
        amqpCode(error) === PRECONDITION_FAILED
          ? `rabbitmq: the queue '${queue}' exists with other settings than a durable ${declare.type} queue without arguments (${serverText(error)}); ` +
              `drop declare to consume it as it is (bind it yourself), or set declare.type to its type`
          : `rabbitmq: cannot declare the queue '${queue}': ${serverText(error)}`,
        { cause: error },
      );
    }
    for (const key of declare.bindingKeys) await channel.bindQueue(queue, declare.exchange, key);
  }

  private onMessage(session: Session, message: ConsumeMessage | null): void {
    if (message === null) {
      session.reason ??= new Error(`RabbitMQ cancelled the consumer (the queue '${this.options.queue}' was deleted?)`);
      this.lost(session);
      return;
    }
    const { acks } = session;
    // Every delivery is noted, one passed over while stopping too: a multiple-ack never covers a message not handed on.
    acks.delivered(message);
    if (!session.alive || this.state !== 'running' || this.deliver === null) return;
    let settled = false;
    const settle = (how: 'ack' | 'nack'): void => {
      if (settled) return;
      settled = true;
      if (!session.alive) return; // the broker gives it back when the connection closes
      try {
        if (how === 'ack') acks.ack(message);
        else acks.nack(message);
      } catch {
        // the channel closed meanwhile: RabbitMQ redelivers the message, mailroom deduplicates it
      }
    };
    const messageId: unknown = message.properties.messageId;
    const delivered: SourceMessage = {
      body: message.content,
      messageId: typeof messageId === 'string' ? messageId : null,
      headers: headersOf(message),
      origin: `rabbitmq queue ${this.options.queue}, delivery ${message.fields.deliveryTag}${message.fields.redelivered ? ' (redelivered)' : ''}`,
      ack: () => settle('ack'),
      nack: () => settle('nack'),
    };
    try {
      this.deliver(delivered);
    } catch (error) {
      this.context?.report(error);
    }
  }

  /** A session ended: unless stopping, report it and reconnect. */
  private lost(session: Session): void {
    if (!session.alive) return;
    session.alive = false;
    void closeQuietly(session.connection);
    // A session still being set up is retried by whoever set it up.
    if (this.session !== session) return;
    this.session = null;
    if (this.state !== 'running') return;
    this.reconnecting ??= this.reconnect().finally(() => {
      this.reconnecting = null;
    });
    // The channel closes before its connection says why: report once both have spoken.
    setImmediate(() => {
      const reason = session.reason;
      const why = reason ? serverText(reason) : 'closed';
      this.context?.report(new Error(`rabbitmq: lost the connection to ${redactUrl(this.options.url)} consuming queue '${this.options.queue}' (${why}); reconnecting`, { cause: reason ?? undefined }));
    });
  }

  /** Tries again with backoff (100 ms doubling to 5 s), reporting each failure, until it consumes or the source stops. */
  private async reconnect(): Promise<void> {
    let delay = 0;
    while (this.state === 'running') {
      delay = nextDelay(delay);
      await this.backoff.sleep(delay);
      if (this.state !== 'running') return;
      try {
        await this.consume();
        return;
      } catch (error) {
        if (this.state === 'running') this.context?.report(error);
      }
    }
  }
}

/**
 * A consumer source reading a RabbitMQ queue with manual acks: at most
 * `prefetch` (default 250) messages are delivered and not yet acknowledged;
 * mailroom acks each one after storing it. With `declare` it declares the
 * exchange, a durable quorum (or classic) queue and its bindings; without it
 * the queue must exist.
 *
 * @example
 * import { rabbitmqSource } from 'mailroom/rabbitmq';
 * const source = rabbitmqSource({ url: process.env.RABBITMQ_URL!, queue: 'billing', declare: { exchange: 'events', bindingKeys: ['order.*'] } });
 * mailroom.consumer({ group: 'billing', source, handlers });
 */
export function rabbitmqSource(options: RabbitMqSourceOptions): RabbitMqSource {
  return new RabbitMqConsumerSource(resolveSourceOptions(options));
}
