/**
 * The source's durable pull consumer: looked up, or created with explicit
 * acks, unlimited redelivery and an AckWait that covers the handler timeout.
 */
import { AckPolicy, DeliverPolicy, JetStreamApiCodes, JetStreamApiError, type ConsumerConfig, type ConsumerInfo, type JetStreamManager } from '@nats-io/jetstream';
import { nanos } from '@nats-io/transport-node';
import { reason } from './connect.ts';
import type { NatsStartFrom } from './options.ts';

/** AckWait of a created consumer when neither `ackWait` nor a longer handler timeout says otherwise. */
export const DEFAULT_ACK_WAIT_MS = 30_000;

/** What the source needs of its consumer. */
export interface ConsumerSpec {
  stream: string;
  durable: string;
  filterSubject: string | null;
  ackWaitMs: number;
  from: NatsStartFrom;
  /** `nats <servers>`, for errors. */
  where: string;
}

/** The consumer's info, or null when it does not exist. */
export async function consumerInfoOrNull(jsm: JetStreamManager, stream: string, durable: string): Promise<ConsumerInfo | null> {
  try {
    return await jsm.consumers.info(stream, durable);
  } catch (error) {
    if (error instanceof JetStreamApiError && (error.code === JetStreamApiCodes.ConsumerNotFound || error.code === JetStreamApiCodes.StreamNotFound)) return null;
    throw error;
  }
}

/**
 * Returns the durable consumer, creating it when missing. An existing one is
 * used as it is (its settings are `check()`'s business) as long as it is a
 * pull consumer with explicit acks; otherwise this rejects saying why.
 *
 * @example
 * const info = await ensureConsumer(jsm, { stream: 'orders', durable: 'billing', filterSubject: null, ackWaitMs: 30_000, from: 'now', where: 'nats://127.0.0.1:4222' });
 */
export async function ensureConsumer(jsm: JetStreamManager, spec: ConsumerSpec): Promise<{ info: ConsumerInfo; created: boolean }> {
  const existing = await consumerInfoOrNull(jsm, spec.stream, spec.durable);
  if (existing) return { info: usable(existing), created: false };
  try {
    await jsm.streams.info(spec.stream);
  } catch (error) {
    if (error instanceof JetStreamApiError && error.code === JetStreamApiCodes.StreamNotFound) {
      throw new Error(
        `nats: stream ${spec.stream} does not exist on ${spec.where}; the relay's nats() target creates it when the relay starts, or create it yourself (nats stream add ${spec.stream} --subjects '${spec.stream}.>' --storage file)`,
        { cause: error },
      );
    }
    throw error;
  }
  const config: Partial<ConsumerConfig> = {
    durable_name: spec.durable,
    ack_policy: AckPolicy.Explicit,
    ack_wait: nanos(spec.ackWaitMs),
    max_deliver: -1,
    deliver_policy: spec.from === 'earliest' ? DeliverPolicy.All : DeliverPolicy.New,
  };
  if (spec.filterSubject !== null) config.filter_subject = spec.filterSubject;
  try {
    return { info: await jsm.consumers.add(spec.stream, config), created: true };
  } catch (error) {
    // Another source of the group may have created it at the same moment.
    const raced = await consumerInfoOrNull(jsm, spec.stream, spec.durable);
    if (raced) return { info: usable(raced), created: false };
    throw new Error(`nats: cannot create durable consumer ${spec.durable} on stream ${spec.stream} (${spec.where}): ${reason(error)}`, { cause: error });
  }
}

function usable(info: ConsumerInfo): ConsumerInfo {
  const refused = consumerRefusal(info);
  if (refused !== null) throw new Error(`nats: ${refused}`);
  return info;
}

/**
 * Why the source cannot read an existing durable consumer, or null when it
 * can: a push consumer, or one whose acks are not explicit. `start` rejects
 * with it and `check()` reports it (`nats-consumer-refused`), so that
 * `mailroom doctor` says so before a start fails.
 *
 * @example
 * consumerRefusal(await jsm.consumers.info('orders', 'billing')) // null, or 'consumer billing on stream orders has ack_policy all; …'
 */
export function consumerRefusal(info: ConsumerInfo): string | null {
  const durable = info.config.durable_name ?? info.name;
  const stream = info.stream_name;
  const fix = `pass another durable name, or delete it (nats consumer rm ${stream} ${durable}) and let the source create it`;
  if (info.config.deliver_subject) {
    return `consumer ${durable} on stream ${stream} is a push consumer (deliver_subject ${info.config.deliver_subject}); natsSource reads a pull consumer: ${fix}`;
  }
  if (info.config.ack_policy !== AckPolicy.Explicit) {
    return (
      `consumer ${durable} on stream ${stream} has ack_policy ${info.config.ack_policy}; mailroom acks each message after storing it and needs ack_policy explicit ` +
      `(with ack_policy all, one process's ack would also settle messages another process of the group holds and has not stored): ${fix}`
    );
  }
  return null;
}
