/**
 * JetStream settings that break one of mailroom's guarantees, as
 * SafetyWarnings: pure functions of what the server reports.
 */
import { millis } from '@nats-io/transport-node';
import type { ConsumerInfo, StreamInfo } from '@nats-io/jetstream';
import { ENVELOPE_ALLOWANCE_BYTES, type SafetyWarning } from '../safety.ts';
import { streamAddCommand } from './stream.ts';
import { consumerRefusal } from './consumer.ts';
import type { ResolvedNatsTargetOptions } from './options.ts';

function seconds(ms: number): string {
  return ms % 1000 === 0 ? `${ms / 1000} s` : `${(ms / 1000).toFixed(1)} s`;
}

/**
 * The target's warnings for its stream (`info` null: the stream does not exist).
 *
 * - `nats-stream-missing`: `declare: false` and no stream: every publish fails.
 * - `nats-duplicate-window`: the duplicate window is shorter than the relay's
 *   republish horizon, so a republish after a relay crash is stored twice.
 * - `nats-memory-storage`: memory storage loses every message on a server restart.
 * - `nats-max-payload`: the server's `max_payload` (or the stream's
 *   `max_msg_size`) is below the largest event `publish` accepts, so such an
 *   event is refused on every retry and holds the relay.
 *
 * @example
 * targetWarnings(await streamInfoOrNull(jsm, 'orders'), options, { republishHorizonMs: 90_000 }, 'nats nats://127.0.0.1:4222 stream orders')
 */
export function targetWarnings(
  info: StreamInfo | null,
  options: ResolvedNatsTargetOptions,
  republishHorizonMs: number,
  subject: string,
  sizes: { maxPayloadBytes?: number | undefined; serverMaxPayload?: number | undefined } = {},
): SafetyWarning[] {
  const warnings: SafetyWarning[] = [];
  const size = sizeWarning(info, options, subject, sizes);
  if (size) warnings.push(size);
  if (info === null) {
    if (!options.declare) {
      warnings.push({
        subject,
        code: 'nats-stream-missing',
        message:
          `stream ${options.stream} does not exist and the target has declare: false, so every publish fails and the relay stops at the first event. ` +
          `Create it (${streamAddCommand(options)}), or set declare: true to let the target create it.`,
      });
    }
    return warnings;
  }
  const windowMs = millis(info.config.duplicate_window ?? 0);
  if (windowMs < republishHorizonMs) {
    warnings.push({
      subject,
      code: 'nats-duplicate-window',
      message:
        `stream ${options.stream} keeps message ids for ${seconds(windowMs)} (duplicate_window), less than the ${seconds(republishHorizonMs)} after which the relay may publish an event again ` +
        `(a relay that crashed after the PubAck, before its cursor committed): such a republish is stored as a second message and every consumer group receives it twice ` +
        `(mailroom consumers deduplicate it; other consumers may not). ` +
        `Raise the window to at least ${seconds(Math.ceil(republishHorizonMs / 1000) * 1000)}: nats stream edit ${options.stream} --dupe-window ${Math.ceil(republishHorizonMs / 1000)}s.`,
    });
  }
  if (info.config.storage === 'memory') {
    warnings.push({
      subject,
      code: 'nats-memory-storage',
      message:
        `stream ${options.stream} uses memory storage: a server restart loses every message in it, including events the relay has already marked as delivered. ` +
        `Use file storage: recreate the stream with --storage file (the storage type cannot be edited), e.g. ${streamAddCommand(options)}.`,
    });
  }
  return warnings;
}

/**
 * An event of the largest payload `publish` accepts, with its envelope and
 * headers, must fit the server's `max_payload` and the stream's
 * `max_msg_size`; else the stream refuses it on every retry.
 */
function sizeWarning(
  info: StreamInfo | null,
  options: ResolvedNatsTargetOptions,
  subject: string,
  sizes: { maxPayloadBytes?: number | undefined; serverMaxPayload?: number | undefined },
): SafetyWarning | null {
  const { maxPayloadBytes, serverMaxPayload } = sizes;
  if (maxPayloadBytes === undefined) return null;
  const streamMax = info !== null && (info.config.max_msg_size ?? -1) > 0 ? info.config.max_msg_size! : Infinity;
  const serverMax = serverMaxPayload !== undefined && serverMaxPayload > 0 ? serverMaxPayload : Infinity;
  const limit = Math.min(streamMax, serverMax);
  const largest = maxPayloadBytes + ENVELOPE_ALLOWANCE_BYTES;
  if (largest <= limit) return null;
  const which = streamMax <= serverMax ? `stream ${options.stream}'s max_msg_size (${limit} bytes)` : `the server's max_payload (${limit} bytes)`;
  const raise = streamMax <= serverMax ? `nats stream edit ${options.stream} --max-msg-size ${largest}` : `max_payload: ${largest} in the server's configuration`;
  return {
    subject,
    code: 'nats-max-payload',
    message:
      `publish accepts payloads of up to ${maxPayloadBytes} bytes (maxPayloadBytes), and such an event with its envelope and headers (up to about ${ENVELOPE_ALLOWANCE_BYTES} bytes more) ` +
      `does not fit ${which}: the stream refuses it on every retry and the relay delivers nothing after it. ` +
      `Lower maxPayloadBytes to ${Math.max(1, limit - ENVELOPE_ALLOWANCE_BYTES)} or less in createMailroom, or raise the limit (${raise}).`,
  };
}

/**
 * The source's warnings for a durable consumer that already exists.
 *
 * - `nats-consumer-refused`: the source cannot read it (a push consumer, or
 *   acks that are not explicit) and `start` would reject; alone, since the
 *   fix (another durable, or this one recreated) settles the rest.
 * - `nats-ack-wait`: its AckWait is shorter than the group's handler timeout.
 * - `nats-max-deliver`: it stops redelivering a message after `max_deliver`
 *   deliveries, so a message mailroom could not store that often (database
 *   down) is never delivered again: lost.
 *
 * @example
 * sourceWarnings(await jsm.consumers.info('orders', 'billing'), 30_000, 'nats nats://127.0.0.1:4222 stream orders consumer billing')
 */
export function sourceWarnings(info: ConsumerInfo, handlerTimeoutMs: number | null, subject: string): SafetyWarning[] {
  const refused = consumerRefusal(info);
  if (refused !== null) return [{ subject, code: 'nats-consumer-refused', message: `${refused}. The source refuses to start on it.` }];
  const warnings: SafetyWarning[] = [];
  const name = info.config.durable_name ?? info.name;
  const ackWaitMs = millis(info.config.ack_wait ?? 0);
  if (handlerTimeoutMs !== null && ackWaitMs < handlerTimeoutMs) {
    warnings.push({
      subject,
      code: 'nats-ack-wait',
      message:
        `durable consumer ${name} on stream ${info.stream_name} has ack_wait ${seconds(ackWaitMs)}, shorter than the group's handler timeout of ${seconds(handlerTimeoutMs)}: ` +
        `messages still waiting for their ack are redelivered meanwhile, and a busy group sees each one several times (deduplicated, but wasted work and misleading redelivery counts). ` +
        `Raise it: nats consumer edit ${info.stream_name} ${name} --wait ${Math.ceil(handlerTimeoutMs / 1000)}s (or delete the consumer and let the source create it with ackWait).`,
    });
  }
  const maxDeliver = info.config.max_deliver ?? -1;
  if (maxDeliver > 0) {
    warnings.push({
      subject,
      code: 'nats-max-deliver',
      message:
        `durable consumer ${name} on stream ${info.stream_name} has max_deliver ${maxDeliver}: after ${maxDeliver} deliveries a message is never delivered again, ` +
        `so one that mailroom could not store that often (database down, process restarts) is silently lost. ` +
        `Set it to unlimited: recreate the consumer with max_deliver -1 (delete it and let the source create it).`,
    });
  }
  return warnings;
}
