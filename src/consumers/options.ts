import { toMilliseconds, type Duration } from '../duration.ts';
import { checkOptionNames, type OptionNames } from '../option-names.ts';
import { ValidationError } from '../errors.ts';
import { assertEventType } from '../events/event-type.ts';
import { resolveRetryPolicy, type RetryOptions, type RetryPolicy } from '../retry/backoff.ts';
import { defaultClassifier, type ErrorClassifier } from '../retry/classify.ts';
import type { ConsumerSource } from '../brokers/source.ts';
import { DEFAULT_MAX_PAYLOAD_BYTES } from '../payload.ts';
import type { RateLimit } from '../worker/queue-controls.ts';
import type { EventHandler } from './handle-event.ts';

/** Options of `mailroom.consumer()`. */
export interface ConsumerOptions {
  /** The consumer group: every group gets every event of the types it handles, once. 1-64 lower-case letters, digits, `_` or `-`. */
  group: string;
  /** Handlers by event type. The group subscribes to exactly these types. */
  handlers: Record<string, EventHandler>;
  /**
   * Read the group's events from a broker (`rabbitmqSource`, `natsSource`,
   * `redisSource` or your own) instead of the internal relay. Each message is
   * stored as a job of the group before the broker hears `ack`.
   */
  source?: ConsumerSource;
  /** With a `source`: the largest message accepted; a larger one is dead-lettered as `validation`. Default 1 MiB. */
  maxMessageBytes?: number;
  /**
   * Where a new group starts (internal events only; a broker source has its own option): `'now'` (default) gets the events committed after
   * it was first started; `'earliest'` also gets the retained events the relay
   * already delivered. Only the group's first start decides.
   */
  from?: 'now' | 'earliest';
  /** Attempts in all for one event (default 25), the backoff between them, and the age after which it is dead-lettered. */
  retry?: RetryOptions;
  /** How long one handler run may take; past it, `ctx.signal` aborts and the attempt fails as `timeout`. Default none. */
  timeout?: Duration;
  /** Which errors are worth retrying. Default: the core's classifier (see docs/JOBS.md). */
  classify?: ErrorClassifier;
  /** How long the inbox remembers a handled event. Must outlast the retry horizon. Default `'7d'`. */
  inboxRetention?: Duration;
  /** Events handled at once by this process. Default 10. */
  concurrency?: number;
  /** How long a claim lasts without a heartbeat. Default `'30s'`. */
  lease?: Duration;
  /** How often to look for events when no NOTIFY arrives. Default `'1s'`. */
  pollInterval?: Duration;
  /**
   * Jobs claimed ahead of free slots. Default 0. A group fed by a broker source takes a backlog
   * much faster with one (docs/BROKERS.md): at `concurrency + prefetch` of 200 or more its
   * messages are held for the worker and stored already claimed by it.
   */
  prefetch?: number;
  /** Shared across processes: at most `max` events start per `per`. */
  rateLimit?: RateLimit;
  /** Shared across processes: at most this many events of the group are handled at once. */
  globalConcurrency?: number;
  /** Run the lease-rescue and retention loops in this process. Default true. */
  maintenance?: boolean;
}

/** Consumer options validated, with defaults filled in. */
export interface ResolvedConsumerOptions {
  group: string;
  queue: string;
  types: string[];
  from: 'now' | 'earliest';
  maxAttempts: number;
  maxAgeMs: number | null;
  retry: RetryPolicy;
  timeoutMs: number | null;
  classify: ErrorClassifier;
  inboxRetentionMs: number;
  source: ConsumerSource | null;
  maxMessageBytes: number;
}

const GROUP = /^[a-z0-9][a-z0-9_-]{0,63}$/;

function invalid(path: string, message: string): ValidationError {
  return new ValidationError(message, [{ path, message }]);
}

/** The queue of a group's jobs. */
export function queueOfGroup(group: string): string {
  return `consumer.${group}`;
}

/** Throws a ValidationError unless `group` is a valid consumer group name (`caller` starts the message). */
export function assertGroupName(group: unknown, caller: string): asserts group is string {
  if (typeof group !== 'string' || !GROUP.test(group)) {
    throw invalid('group', `${caller}: group ${JSON.stringify(group)} is not valid; use 1-64 lower-case letters, digits, '_' or '-', starting with a letter or digit`);
  }
}

/** Every option name of `consumer()` (the config file's consumers are checked against it too). */
export const CONSUMER_OPTION_NAMES: OptionNames<ConsumerOptions> = {
  group: true, handlers: true, source: true, maxMessageBytes: true, from: true, retry: true, timeout: true, classify: true,
  inboxRetention: true, concurrency: true, lease: true, pollInterval: true, prefetch: true, rateLimit: true,
  globalConcurrency: true, maintenance: true,
};

/** Validates consumer options (a ValidationError naming the option) and fills in defaults. */
export function resolveConsumerOptions(options: ConsumerOptions): ResolvedConsumerOptions {
  checkOptionNames(options, CONSUMER_OPTION_NAMES, 'consumer');
  if (typeof options !== 'object' || options === null) throw invalid('options', 'consumer: options must be an object');
  const { group } = options;
  assertGroupName(group, 'consumer');
  if (typeof options.handlers !== 'object' || options.handlers === null) throw invalid('handlers', `consumer ${group}: handlers must be an object of event type -> handler`);
  const types = Object.keys(options.handlers).sort();
  if (types.length === 0) throw invalid('handlers', `consumer ${group}: handlers is empty; the group subscribes to the types it handles`);
  for (const type of types) {
    assertEventType(type);
    if (typeof options.handlers[type] !== 'function') throw invalid(`handlers.${type}`, `consumer ${group}: the handler of ${type} is not a function`);
  }
  const source = options.source ?? null;
  if (source !== null) {
    if (typeof source !== 'object' || typeof source.start !== 'function' || typeof source.stop !== 'function' || typeof source.kind !== 'string') {
      throw invalid('source', `consumer ${group}: source must be a broker source such as rabbitmqSource({ url, queue }) (an object with kind, name, start and stop)`);
    }
    if (options.from !== undefined) throw invalid('from', `consumer ${group}: from applies to internal events; with a source, set where to start in the source's options`);
  }
  const maxMessageBytes = options.maxMessageBytes ?? DEFAULT_MAX_PAYLOAD_BYTES;
  if (!Number.isInteger(maxMessageBytes) || maxMessageBytes < 1) throw invalid('maxMessageBytes', `consumer ${group}: maxMessageBytes must be a positive integer, got ${String(options.maxMessageBytes)}`);
  const from = options.from ?? 'now';
  if (from !== 'now' && from !== 'earliest') throw invalid('from', `consumer ${group}: from must be 'now' or 'earliest', got ${JSON.stringify(from)}`);
  const retry = resolveRetryPolicy(options.retry, `consumer ${group}`);
  if (options.classify !== undefined && typeof options.classify !== 'function') throw invalid('classify', `consumer ${group}: classify must be a function`);
  return {
    group,
    queue: queueOfGroup(group),
    types,
    from,
    maxAttempts: retry.maxAttempts,
    maxAgeMs: retry.maxAgeMs,
    retry,
    timeoutMs: options.timeout === undefined ? null : toMilliseconds(options.timeout, `consumer ${group}: timeout`),
    classify: options.classify ?? defaultClassifier,
    inboxRetentionMs: toMilliseconds(options.inboxRetention ?? '7d', `consumer ${group}: inboxRetention`),
    source,
    maxMessageBytes,
  };
}
