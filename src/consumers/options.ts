import { toMilliseconds, type Duration } from '../duration.ts';
import { ValidationError } from '../errors.ts';
import { assertEventType } from '../events/event-type.ts';
import { DEFAULT_MAX_ATTEMPTS } from '../retry/backoff.ts';
import type { RateLimit } from '../worker/queue-controls.ts';
import type { EventHandler } from './handle-event.ts';

/** Options of `mailroom.consumer()`. */
export interface ConsumerOptions {
  /** The consumer group: every group gets every event of the types it handles, once. 1-64 lower-case letters, digits, `_` or `-`. */
  group: string;
  /** Handlers by event type. The group subscribes to exactly these types. */
  handlers: Record<string, EventHandler>;
  /**
   * Where a new group starts: `'now'` (default) gets the events committed after
   * it was first started; `'earliest'` also gets the retained events the relay
   * already delivered. Only the group's first start decides.
   */
  from?: 'now' | 'earliest';
  /** Attempts in all for one event (default 25), and the age after which it is dead-lettered. Backoff follows the core's defaults. */
  retry?: { maxAttempts?: number; maxAge?: Duration };
  /** How long the inbox remembers a handled event. Must outlast the retry horizon. Default `'7d'`. */
  inboxRetention?: Duration;
  /** Events handled at once by this process. Default 10. */
  concurrency?: number;
  /** How long a claim lasts without a heartbeat. Default `'30s'`. */
  lease?: Duration;
  /** How often to look for events when no NOTIFY arrives. Default `'1s'`. */
  pollInterval?: Duration;
  /** Jobs claimed ahead of free slots. Default 0. */
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
  inboxRetentionMs: number;
}

const GROUP = /^[a-z0-9][a-z0-9_-]{0,63}$/;

function invalid(path: string, message: string): ValidationError {
  return new ValidationError(message, [{ path, message }]);
}

/** The queue of a group's jobs. */
export function queueOfGroup(group: string): string {
  return `consumer.${group}`;
}

/** Validates consumer options (a ValidationError naming the option) and fills in defaults. */
export function resolveConsumerOptions(options: ConsumerOptions): ResolvedConsumerOptions {
  if (typeof options !== 'object' || options === null) throw invalid('options', 'consumer: options must be an object');
  const { group } = options;
  if (typeof group !== 'string' || !GROUP.test(group)) {
    throw invalid('group', `consumer: group ${JSON.stringify(group)} is not valid; use 1-64 lower-case letters, digits, '_' or '-', starting with a letter or digit`);
  }
  if (typeof options.handlers !== 'object' || options.handlers === null) throw invalid('handlers', `consumer ${group}: handlers must be an object of event type -> handler`);
  const types = Object.keys(options.handlers).sort();
  if (types.length === 0) throw invalid('handlers', `consumer ${group}: handlers is empty; the group subscribes to the types it handles`);
  for (const type of types) {
    assertEventType(type);
    if (typeof options.handlers[type] !== 'function') throw invalid(`handlers.${type}`, `consumer ${group}: the handler of ${type} is not a function`);
  }
  const from = options.from ?? 'now';
  if (from !== 'now' && from !== 'earliest') throw invalid('from', `consumer ${group}: from must be 'now' or 'earliest', got ${JSON.stringify(from)}`);
  const maxAttempts = options.retry?.maxAttempts ?? DEFAULT_MAX_ATTEMPTS;
  if (!Number.isInteger(maxAttempts) || maxAttempts < 1 || maxAttempts > 1_000_000) {
    throw invalid('retry.maxAttempts', `consumer ${group}: retry.maxAttempts must be an integer from 1 to 1000000, got ${String(maxAttempts)}`);
  }
  const maxAge = options.retry?.maxAge;
  return {
    group,
    queue: queueOfGroup(group),
    types,
    from,
    maxAttempts,
    maxAgeMs: maxAge === undefined ? null : toMilliseconds(maxAge, `consumer ${group}: retry.maxAge`),
    inboxRetentionMs: toMilliseconds(options.inboxRetention ?? '7d', `consumer ${group}: inboxRetention`),
  };
}
