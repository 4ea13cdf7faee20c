/**
 * Options of the Redis Streams target and source, validated with errors that
 * name the option and say how to fix it.
 */
import { toMilliseconds, type Duration } from '../../duration.ts';
import { ValidationError } from '../../errors.ts';
import { DEFAULT_SOURCE_PREFETCH } from '../source.ts';

/** Options of {@link redisStreams}, the relay target. */
export interface RedisTargetOptions {
  /** `redis://[user:password@]host[:port][/db]` or `rediss://…` (TLS). */
  url: string;
  /** The stream key events are added to (created by the first `XADD`). */
  stream: string;
  /** The relay target's name (its cursor): 1-128 letters, digits, `_ . : -`, starting with a letter or digit. Default `redis:<stream>`. */
  name?: string;
  /** Trim the stream to about this many entries on every add (`MAXLEN ~`). Default: no trimming. */
  maxLen?: number;
  /** How long an event id is remembered to refuse a republished event. Default `'24h'`; at least `'1s'`. */
  dedupWindow?: Duration;
  /** How long a batch may wait for Redis's replies before `publish` rejects. Default `'30s'`. */
  ackTimeout?: Duration;
}

/** Options of {@link redisSource}, a consumer group's source. */
export interface RedisSourceOptions {
  /** `redis://[user:password@]host[:port][/db]` or `rediss://…` (TLS). */
  url: string;
  /** The stream key to read. */
  stream: string;
  /** The Redis consumer group. Default: the mailroom consumer group's name (`context.group`). */
  group?: string;
  /** This reader's consumer name in the group. Default `<host>:<pid>:<random>`, new for every source. */
  consumer?: string;
  /** Most entries delivered and not yet acknowledged at once. Default 250. */
  prefetch?: number;
  /**
   * An entry pending longer than this (its consumer died, or never acknowledged it)
   * is claimed with `XAUTOCLAIM` and delivered again. Checked every `claimIdle / 2`.
   * Default the larger of `'60s'` and twice the group's handler timeout.
   */
  claimIdle?: Duration;
  /** Where a new Redis group starts: `'now'` (default, entries added after it is created) or `'earliest'` (the whole stream). */
  from?: 'now' | 'earliest';
}

export interface ResolvedTargetOptions {
  url: string;
  stream: string;
  name: string;
  maxLen: number | null;
  dedupWindowMs: number;
  ackTimeoutMs: number;
}

export interface ResolvedSourceOptions {
  url: string;
  stream: string;
  group: string | null;
  consumer: string | null;
  prefetch: number;
  /** Null: decided at start from the handler timeout. */
  claimIdleMs: number | null;
  from: 'now' | 'earliest';
}

export const DEFAULT_DEDUP_WINDOW_MS = 24 * 3_600_000;
export const DEFAULT_ACK_TIMEOUT_MS = 30_000;
export const MIN_CLAIM_IDLE_MS = 60_000;

const TARGET_NAME = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/;
/** Printable, no spaces: Redis accepts any bytes, but these names end up in logs, errors and `redis-cli`. */
const REDIS_NAME = /^[\x21-\x7e]{1,512}$/;

function invalid(path: string, message: string): ValidationError {
  return new ValidationError(`redis: ${message}`, [{ path, message }]);
}

function record(options: unknown, what: string): Record<string, unknown> {
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    throw invalid('options', `${what} needs an options object, e.g. ${what}({ url: 'redis://127.0.0.1:6379', stream: 'orders' })`);
  }
  return options as Record<string, unknown>;
}

function url(value: unknown): string {
  if (typeof value !== 'string' || value.trim() === '') {
    throw invalid('url', "url must be a non-empty string such as 'redis://127.0.0.1:6379'");
  }
  let parsed: URL;
  try {
    parsed = new URL(value);
  } catch {
    throw invalid('url', `url ${JSON.stringify(redactUrl(value))} is not a URL; use 'redis://host:port' or 'rediss://host:port'`);
  }
  if (parsed.protocol !== 'redis:' && parsed.protocol !== 'rediss:') {
    throw invalid('url', `url must start with redis:// or rediss://, got ${parsed.protocol}//`);
  }
  return value;
}

/**
 * The stream key, checked so that a dedup key can share its cluster hash slot:
 * either no `{`/`}` at all, or a proper hash tag (`{tag}` with a non-empty tag).
 */
function stream(value: unknown): string {
  if (typeof value !== 'string' || !REDIS_NAME.test(value)) {
    throw invalid('stream', 'stream must be a non-empty string of at most 512 printable characters without spaces');
  }
  if ((value.includes('{') || value.includes('}')) && hashTag(value) === null) {
    throw invalid(
      'stream',
      `stream ${JSON.stringify(value)} has braces but no hash tag; use braces only around a non-empty hash tag, e.g. '{orders}' or 'events:{orders}'`,
    );
  }
  return value;
}

/**
 * The cluster hash tag of a key (the text between its first `{` and the next `}`), or null when it has none.
 *
 * @example
 * hashTag('events:{orders}') // 'orders'
 * hashTag('orders') // null
 */
export function hashTag(key: string): string | null {
  const open = key.indexOf('{');
  if (open < 0) return null;
  const close = key.indexOf('}', open + 1);
  if (close < 0 || close === open + 1) return null;
  return key.slice(open + 1, close);
}

function positiveInteger(value: unknown, path: string, max: number): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 1 || value > max) {
    throw invalid(path, `${path} must be a whole number from 1 to ${max}, got ${String(value)}`);
  }
  return value;
}

function duration(value: unknown, path: string, minMs: number, minText: string): number {
  if (typeof value !== 'number' && typeof value !== 'string') {
    throw invalid(path, `${path} must be a duration (milliseconds, or a string such as '30s'), got ${typeof value}`);
  }
  let ms: number;
  try {
    ms = toMilliseconds(value, path);
  } catch (err) {
    throw invalid(path, err instanceof Error ? err.message : String(err));
  }
  if (ms < minMs) throw invalid(path, `${path} must be at least ${minText}, got ${String(value)}`);
  return ms;
}

function redisName(value: unknown, path: string): string {
  if (typeof value !== 'string' || !REDIS_NAME.test(value)) {
    throw invalid(path, `${path} must be a non-empty string of at most 512 printable characters without spaces`);
  }
  return value;
}

/**
 * Validates the target's options and fills in defaults.
 *
 * @example
 * resolveTargetOptions({ url: 'redis://127.0.0.1:6379', stream: 'orders' }).dedupWindowMs // 86400000
 */
export function resolveTargetOptions(options: unknown): ResolvedTargetOptions {
  const o = record(options, 'redisStreams');
  const resolved: ResolvedTargetOptions = {
    url: url(o.url),
    stream: stream(o.stream),
    name: '',
    maxLen: o.maxLen === undefined ? null : positiveInteger(o.maxLen, 'maxLen', Number.MAX_SAFE_INTEGER),
    dedupWindowMs: o.dedupWindow === undefined ? DEFAULT_DEDUP_WINDOW_MS : duration(o.dedupWindow, 'dedupWindow', 1000, '1s'),
    ackTimeoutMs: o.ackTimeout === undefined ? DEFAULT_ACK_TIMEOUT_MS : duration(o.ackTimeout, 'ackTimeout', 1, '1ms'),
  };
  if (o.name === undefined) {
    const name = `redis:${resolved.stream}`;
    if (!TARGET_NAME.test(name)) {
      throw invalid('name', `the default target name ${JSON.stringify(name)} is not a valid name; pass name: 1-128 letters, digits, '_', '.', ':' or '-', starting with a letter or digit`);
    }
    resolved.name = name;
  } else {
    if (typeof o.name !== 'string' || !TARGET_NAME.test(o.name)) {
      throw invalid('name', `name must be 1-128 letters, digits, '_', '.', ':' or '-', starting with a letter or digit, got ${JSON.stringify(o.name)}`);
    }
    resolved.name = o.name;
  }
  return resolved;
}

/**
 * Validates the source's options and fills in defaults.
 *
 * @example
 * resolveSourceOptions({ url: 'redis://127.0.0.1:6379', stream: 'orders' }).prefetch // 250
 */
export function resolveSourceOptions(options: unknown): ResolvedSourceOptions {
  const o = record(options, 'redisSource');
  if (o.from !== undefined && o.from !== 'now' && o.from !== 'earliest') {
    throw invalid('from', `from must be 'now' or 'earliest', got ${JSON.stringify(o.from)}`);
  }
  return {
    url: url(o.url),
    stream: stream(o.stream),
    group: o.group === undefined ? null : redisName(o.group, 'group'),
    consumer: o.consumer === undefined ? null : redisName(o.consumer, 'consumer'),
    prefetch: o.prefetch === undefined ? DEFAULT_SOURCE_PREFETCH : positiveInteger(o.prefetch, 'prefetch', 100_000),
    claimIdleMs: o.claimIdle === undefined ? null : duration(o.claimIdle, 'claimIdle', 100, '100ms'),
    from: (o.from as 'now' | 'earliest' | undefined) ?? 'now',
  };
}

/**
 * The claim threshold when `claimIdle` is not given: max(60 s, 2 × the handler timeout).
 *
 * @example
 * defaultClaimIdleMs(45_000) // 90000
 */
export function defaultClaimIdleMs(handlerTimeoutMs: number | null): number {
  return Math.max(MIN_CLAIM_IDLE_MS, 2 * (handlerTimeoutMs ?? 0));
}

/**
 * A URL fit for logs and errors: the password replaced by `***`.
 *
 * @example
 * redactUrl('redis://app:secret@cache:6379') // 'redis://app:***@cache:6379'
 */
export function redactUrl(value: string): string {
  try {
    const parsed = new URL(value);
    if (parsed.password) parsed.password = '***';
    return parsed.toString().replace(/\/$/, '');
  } catch {
    return value.replace(/\/\/([^:@/]*):[^@/]*@/, '//$1:***@');
  }
}
