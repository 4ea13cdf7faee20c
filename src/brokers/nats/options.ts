/**
 * Options of the NATS JetStream target and source, validated with errors that
 * name the option and say what a valid value looks like.
 */
import { toMilliseconds, type Duration } from '../../duration.ts';
import { ValidationError } from '../../errors.ts';
import { DEFAULT_SOURCE_PREFETCH } from '../source.ts';

/** Options of {@link nats}: the relay target publishing to a JetStream stream. */
export interface NatsTargetOptions {
  /** Server URL (`nats://127.0.0.1:4222`) or several servers of one cluster. */
  url: string | string[];
  /** The JetStream stream the events go to. */
  stream: string;
  /** Subjects are `<subjectPrefix>.<event type>`. Default: the stream name. */
  subjectPrefix?: string;
  /** The target's name (its relay cursor). Default `nats:<stream>`. */
  name?: string;
  /** Create the stream when it does not exist (subjects `<prefix>.>`, file storage, a duplicate window of at least 2 minutes). Default true. */
  declare?: boolean;
  /** How long to wait for the PubAcks of a batch before the publish rejects. Default `'30s'`. */
  ackTimeout?: Duration;
}

/** Where a new durable consumer starts reading: new messages only, or the whole stream. */
export type NatsStartFrom = 'now' | 'earliest';

/** Options of {@link natsSource}: a durable pull consumer a consumer group reads from. */
export interface NatsSourceOptions {
  /** Server URL (`nats://127.0.0.1:4222`) or several servers of one cluster. */
  url: string | string[];
  /** The JetStream stream to read. */
  stream: string;
  /** The durable consumer's name. Default: the consumer group's name. */
  durable?: string;
  /** Only messages on these subjects (e.g. `orders.order.created`); set when the consumer is created. */
  filterSubject?: string;
  /** AckWait of a consumer this source creates. Default: the group's handler timeout, at least `'30s'`. */
  ackWait?: Duration;
  /** Delivered, unacknowledged messages at most. Default 250. */
  prefetch?: number;
  /** Where a consumer this source creates starts: `'now'` (new messages) or `'earliest'` (the whole stream). Default `'now'`. */
  from?: NatsStartFrom;
}

/** Target options validated, with defaults filled in. */
export interface ResolvedNatsTargetOptions {
  servers: string[];
  stream: string;
  subjectPrefix: string;
  name: string;
  declare: boolean;
  ackTimeoutMs: number;
}

/** Source options validated, with defaults filled in (`durable` and `ackWaitMs` may come from the group at start). */
export interface ResolvedNatsSourceOptions {
  servers: string[];
  stream: string;
  durable: string | null;
  filterSubject: string | null;
  ackWaitMs: number | null;
  prefetch: number;
  from: NatsStartFrom;
}

/** Stream names: letters, digits, `_` and `-` (no `.`, `*`, `>`, spaces or path separators, which NATS forbids or files choke on). */
const STREAM = /^[A-Za-z0-9_-]{1,120}$/;
/** Durable consumer names: the same characters as a stream name. */
const DURABLE = /^[A-Za-z0-9_-]{1,120}$/;
/** A subject token: anything but `.`, wildcards, whitespace and control characters. */
const TOKEN = /^[^.*>\s\u0000-\u001f\u007f]+$/;
/** Relay target names (src/relay/target.ts). */
const TARGET_NAME = /^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$/;

function invalid(path: string, message: string): ValidationError {
  return new ValidationError(`nats: ${message}`, [{ path, message }]);
}

/** True when `subject` is a literal subject (dot-separated tokens, no wildcards). */
export function isLiteralSubject(subject: string): boolean {
  return subject.length > 0 && subject.length <= 255 && subject.split('.').every((t) => TOKEN.test(t));
}

function isFilterSubject(subject: string): boolean {
  if (subject.length === 0 || subject.length > 255) return false;
  const tokens = subject.split('.');
  return tokens.every((t, i) => t === '*' || (t === '>' && i === tokens.length - 1) || TOKEN.test(t));
}

function servers(url: unknown): string[] {
  const list = Array.isArray(url) ? url : [url];
  if (list.length === 0) throw invalid('url', 'url must be a server URL such as nats://127.0.0.1:4222, or a non-empty array of them; got an empty array');
  for (const [i, u] of list.entries()) {
    const path = Array.isArray(url) ? `url[${i}]` : 'url';
    if (typeof u !== 'string' || u.trim() === '' || /\s/.test(u)) {
      throw invalid(path, `${path} must be a server URL such as nats://127.0.0.1:4222, got ${JSON.stringify(u)}`);
    }
    let parsed: URL;
    try {
      parsed = new URL(u.includes('://') ? u : `nats://${u}`);
    } catch {
      throw invalid(path, `${path} ${JSON.stringify(u)} is not a URL; use nats://host:port`);
    }
    if (!['nats:', 'tls:', 'ws:', 'wss:'].includes(parsed.protocol)) {
      throw invalid(path, `${path} must use nats://, tls://, ws:// or wss://, got ${parsed.protocol}//`);
    }
  }
  return list as string[];
}

function stream(value: unknown): string {
  if (typeof value !== 'string' || !STREAM.test(value)) {
    throw invalid('stream', `stream must be 1-120 letters, digits, '_' or '-' (NATS stream names cannot hold '.', '*', '>' or spaces), got ${JSON.stringify(value)}`);
  }
  return value;
}

function duration(value: Duration | undefined, path: string, min: number): number | null {
  if (value === undefined) return null;
  let ms: number;
  try {
    ms = toMilliseconds(value, `nats ${path}`);
  } catch {
    throw invalid(path, `${path} must be a duration (milliseconds, or a string like '30s'), got ${JSON.stringify(value)}`);
  }
  if (ms < min) throw invalid(path, `${path} must be at least ${min} ms, got ${ms} ms`);
  return ms;
}

function object(options: unknown, what: string): Record<string, unknown> {
  if (typeof options !== 'object' || options === null) throw invalid('options', `options must be an object such as ${what}({ url: 'nats://127.0.0.1:4222', stream: 'orders' })`);
  return options as Record<string, unknown>;
}

/** Validates the target's options (a ValidationError naming the option) and fills in defaults. */
export function resolveTargetOptions(options: NatsTargetOptions): ResolvedNatsTargetOptions {
  const o = object(options, 'nats');
  const resolvedStream = stream(o.stream);
  const prefix = o.subjectPrefix ?? resolvedStream;
  if (typeof prefix !== 'string' || !isLiteralSubject(prefix)) {
    throw invalid('subjectPrefix', `subjectPrefix must be a subject without wildcards (tokens separated by '.', e.g. 'orders' or 'shop.orders'), got ${JSON.stringify(o.subjectPrefix)}`);
  }
  const name = o.name ?? `nats:${resolvedStream}`;
  if (typeof name !== 'string' || !TARGET_NAME.test(name)) {
    throw invalid('name', `name must be 1-128 letters, digits, '_', '.', ':' or '-', starting with a letter or digit, got ${JSON.stringify(name)}`);
  }
  if (o.declare !== undefined && typeof o.declare !== 'boolean') throw invalid('declare', `declare must be true or false, got ${JSON.stringify(o.declare)}`);
  return {
    servers: servers(o.url),
    stream: resolvedStream,
    subjectPrefix: prefix,
    name,
    declare: o.declare !== false,
    ackTimeoutMs: duration(o.ackTimeout as Duration | undefined, 'ackTimeout', 1) ?? 30_000,
  };
}

/** Validates a durable consumer name (from the options or the consumer group). */
export function assertDurable(value: unknown, from: 'durable' | 'group'): string {
  if (typeof value !== 'string' || !DURABLE.test(value)) {
    const hint = from === 'group' ? ` (the consumer group's name, used because the source has no durable option; pass natsSource({ ..., durable: 'billing' }))` : '';
    throw invalid('durable', `durable must be 1-120 letters, digits, '_' or '-' (NATS consumer names cannot hold '.', '*', '>' or spaces), got ${JSON.stringify(value)}${hint}`);
  }
  return value;
}

/** Validates the source's options (a ValidationError naming the option) and fills in defaults. */
export function resolveSourceOptions(options: NatsSourceOptions): ResolvedNatsSourceOptions {
  const o = object(options, 'natsSource');
  const resolvedStream = stream(o.stream);
  const durable = o.durable === undefined ? null : assertDurable(o.durable, 'durable');
  const filter = o.filterSubject ?? null;
  if (filter !== null && (typeof filter !== 'string' || !isFilterSubject(filter))) {
    throw invalid('filterSubject', `filterSubject must be a subject, wildcards '*' and a final '>' allowed (e.g. 'orders.order.*'), got ${JSON.stringify(o.filterSubject)}`);
  }
  const prefetch = o.prefetch ?? DEFAULT_SOURCE_PREFETCH;
  if (typeof prefetch !== 'number' || !Number.isInteger(prefetch) || prefetch < 1 || prefetch > 10_000) {
    throw invalid('prefetch', `prefetch must be an integer from 1 to 10000, got ${JSON.stringify(o.prefetch)}`);
  }
  const from = o.from ?? 'now';
  if (from !== 'now' && from !== 'earliest') throw invalid('from', `from must be 'now' or 'earliest', got ${JSON.stringify(o.from)}`);
  return {
    servers: servers(o.url),
    stream: resolvedStream,
    durable,
    filterSubject: filter,
    ackWaitMs: duration(o.ackWait as Duration | undefined, 'ackWait', 1000),
    prefetch,
    from,
  };
}
