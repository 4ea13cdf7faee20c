/**
 * Options of the RabbitMQ target and source, checked up front: a bad option
 * is a ValidationError naming it, before any connection is made.
 */
import type { Duration } from '../../duration.ts';
import { toMilliseconds } from '../../duration.ts';
import { ValidationError } from '../../errors.ts';
import { DEFAULT_SOURCE_PREFETCH } from '../source.ts';
import type { CloudEventEnvelope } from '../../events/envelope.ts';

/** Options of `rabbitmq()`, the relay target. */
export interface RabbitMqTargetOptions {
  /** The broker, e.g. `amqp://user:password@host:5672/vhost` (or `amqps://`). */
  url: string;
  /** The exchange events are published to. */
  exchange: string;
  /** The target's name (it names the relay's cursor). Default `rabbitmq:<exchange>`. */
  name?: string;
  /** Declare the exchange as a durable topic exchange on connect. Default true; with false it must exist. */
  declare?: boolean;
  /** The routing key of an event. Default its type (`order.created`). */
  routingKey?: (envelope: CloudEventEnvelope) => string;
  /** How long to wait for the broker's confirms of a batch before failing it. Default `'30s'`. */
  confirmTimeout?: Duration;
  /**
   * What to do with an event no queue is bound for (RabbitMQ confirms and drops it):
   * `'warn'` (default) counts it and warns once per routing key; `'fail'` fails the batch.
   */
  unroutable?: 'warn' | 'fail';
  /**
   * Queues bound to the exchange that other (non-mailroom) services consume: `check()` warns
   * about each one without a delivery limit or dead-letter exchange.
   */
  checkQueues?: string[];
}

/** The queue a source declares with `declare`. */
export interface RabbitMqDeclareOptions {
  /** The exchange to bind to (declared as a durable topic exchange). */
  exchange: string;
  /** Binding keys (topic patterns). Default `['#']`: every event. */
  bindingKeys?: string[];
  /** The queue's type. Default `'quorum'`. */
  type?: 'quorum' | 'classic';
}

/** Options of `rabbitmqSource()`, a consumer group's source. */
export interface RabbitMqSourceOptions {
  /** The broker, e.g. `amqp://user:password@host:5672/vhost` (or `amqps://`). */
  url: string;
  /** The queue to consume. */
  queue: string;
  /** Delivered, unacknowledged messages at most (the channel's prefetch). Default 250. */
  prefetch?: number;
  /** Declare the exchange, a durable queue and its bindings on every connect. Without it the queue must exist. */
  declare?: RabbitMqDeclareOptions;
}

export interface ResolvedTargetOptions {
  url: string;
  exchange: string;
  name: string;
  declare: boolean;
  routingKey: ((envelope: CloudEventEnvelope) => string) | null;
  confirmTimeoutMs: number;
  unroutable: 'warn' | 'fail';
  checkQueues: string[];
}

export interface ResolvedSourceOptions {
  url: string;
  queue: string;
  prefetch: number;
  declare: { exchange: string; bindingKeys: string[]; type: 'quorum' | 'classic' } | null;
}

const TARGET_NAME = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/;
/** AMQP short strings: exchange and queue names are at most 255 bytes. */
const MAX_AMQP_NAME_BYTES = 255;
const MAX_PREFETCH = 65_535;

function invalid(path: string, message: string): ValidationError {
  return new ValidationError(`rabbitmq: ${message}`, [{ path, message }]);
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function checkUrl(url: unknown): string {
  if (typeof url !== 'string' || url.length === 0) throw invalid('url', 'url must be a non-empty string such as amqp://guest:guest@127.0.0.1:5672');
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw invalid('url', `url ${JSON.stringify(redactUrl(url))} is not a URL; use amqp://user:password@host:5672/vhost`);
  }
  if (parsed.protocol !== 'amqp:' && parsed.protocol !== 'amqps:') {
    throw invalid('url', `url must start with amqp:// or amqps://, got ${JSON.stringify(parsed.protocol)}`);
  }
  return url;
}

function checkAmqpName(value: unknown, path: string, what: string): string {
  if (typeof value !== 'string' || value.length === 0) throw invalid(path, `${what} must be a non-empty string`);
  if (Buffer.byteLength(value, 'utf8') > MAX_AMQP_NAME_BYTES) throw invalid(path, `${what} must be at most ${MAX_AMQP_NAME_BYTES} bytes (an AMQP short string)`);
  if (/[\u0000-\u001f\u007f]/.test(value)) throw invalid(path, `${what} must not contain control characters`);
  return value;
}

function checkKnownKeys(options: Record<string, unknown>, known: readonly string[], where: string): void {
  for (const key of Object.keys(options)) {
    if (!known.includes(key)) throw invalid(key, `${where}: unknown option ${JSON.stringify(key)}; known options are ${known.join(', ')}`);
  }
}

/**
 * The default target name for an exchange: `rabbitmq:<exchange>`, with
 * characters a target name does not allow replaced by `-`, at most 128.
 *
 * @example
 * defaultTargetName('orders events') // 'rabbitmq:orders-events'
 */
export function defaultTargetName(exchange: string): string {
  return `rabbitmq:${exchange.replace(/[^A-Za-z0-9_.:-]/g, '-')}`.slice(0, 128);
}

/**
 * A URL fit for logs and error messages: the password replaced by `***`.
 *
 * @example
 * redactUrl('amqp://app:secret@mq:5672') // 'amqp://app:***@mq:5672'
 */
export function redactUrl(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password === '') return url;
    parsed.password = '***';
    return parsed.toString();
  } catch {
    return url.replace(/\/\/([^:/@]*):[^@/]*@/, '//$1:***@');
  }
}

/** Validates the target's options (a ValidationError naming the option) and fills in defaults. */
export function resolveTargetOptions(options: RabbitMqTargetOptions): ResolvedTargetOptions {
  if (!isObject(options)) throw invalid('options', 'target options must be an object: rabbitmq({ url, exchange })');
  checkKnownKeys(options, ['url', 'exchange', 'name', 'declare', 'routingKey', 'confirmTimeout', 'unroutable', 'checkQueues'], 'target');
  const url = checkUrl(options.url);
  const exchange = checkAmqpName(options.exchange, 'exchange', 'exchange');
  let name = defaultTargetName(exchange);
  if (options.name !== undefined) {
    if (typeof options.name !== 'string' || !TARGET_NAME.test(options.name)) {
      throw invalid('name', `name ${JSON.stringify(options.name)} is not valid; use 1-128 characters of letters, digits, '_', '.', ':' or '-', starting with a letter or digit`);
    }
    name = options.name;
  }
  if (options.declare !== undefined && typeof options.declare !== 'boolean') throw invalid('declare', 'declare must be true or false');
  if (options.routingKey !== undefined && typeof options.routingKey !== 'function') {
    throw invalid('routingKey', 'routingKey must be a function (envelope) => string');
  }
  let confirmTimeoutMs = 30_000;
  if (options.confirmTimeout !== undefined) {
    try {
      confirmTimeoutMs = toMilliseconds(options.confirmTimeout, 'confirmTimeout');
    } catch (error) {
      throw invalid('confirmTimeout', `confirmTimeout: ${(error as Error).message.replace(/^confirmTimeout: /, '')}`);
    }
    if (confirmTimeoutMs < 1) throw invalid('confirmTimeout', 'confirmTimeout must be at least 1 ms');
  }
  const unroutable = options.unroutable ?? 'warn';
  if (unroutable !== 'warn' && unroutable !== 'fail') throw invalid('unroutable', `unroutable must be 'warn' or 'fail', got ${JSON.stringify(options.unroutable)}`);
  const checkQueues = options.checkQueues ?? [];
  if (!Array.isArray(checkQueues)) throw invalid('checkQueues', 'checkQueues must be an array of queue names');
  checkQueues.forEach((q, i) => checkAmqpName(q, `checkQueues[${i}]`, `checkQueues[${i}]`));
  return { url, exchange, name, declare: options.declare ?? true, routingKey: options.routingKey ?? null, confirmTimeoutMs, unroutable, checkQueues: [...checkQueues] };
}

/** Validates the source's options (a ValidationError naming the option) and fills in defaults. */
export function resolveSourceOptions(options: RabbitMqSourceOptions): ResolvedSourceOptions {
  if (!isObject(options)) throw invalid('options', 'source options must be an object: rabbitmqSource({ url, queue })');
  checkKnownKeys(options, ['url', 'queue', 'prefetch', 'declare'], 'source');
  const url = checkUrl(options.url);
  const queue = checkAmqpName(options.queue, 'queue', 'queue');
  const prefetch = options.prefetch ?? DEFAULT_SOURCE_PREFETCH;
  if (typeof prefetch !== 'number' || !Number.isInteger(prefetch) || prefetch < 1 || prefetch > MAX_PREFETCH) {
    throw invalid('prefetch', `prefetch must be an integer from 1 to ${MAX_PREFETCH}, got ${String(options.prefetch)}`);
  }
  let declare: ResolvedSourceOptions['declare'] = null;
  if (options.declare !== undefined) {
    const d: unknown = options.declare;
    if (!isObject(d)) throw invalid('declare', 'declare must be an object: { exchange, bindingKeys?, type? }');
    checkKnownKeys(d, ['exchange', 'bindingKeys', 'type'], 'source declare');
    const exchange = checkAmqpName(d.exchange, 'declare.exchange', 'declare.exchange');
    const bindingKeys = d.bindingKeys ?? ['#'];
    if (!Array.isArray(bindingKeys) || bindingKeys.length === 0) throw invalid('declare.bindingKeys', 'declare.bindingKeys must be a non-empty array of binding keys (topic patterns such as "order.*" or "#")');
    bindingKeys.forEach((k: unknown, i) => {
      if (typeof k !== 'string' || Buffer.byteLength(k, 'utf8') > MAX_AMQP_NAME_BYTES) {
        throw invalid(`declare.bindingKeys[${i}]`, `declare.bindingKeys[${i}] must be a string of at most ${MAX_AMQP_NAME_BYTES} bytes`);
      }
    });
    const type = d.type ?? 'quorum';
    if (type !== 'quorum' && type !== 'classic') throw invalid('declare.type', `declare.type must be 'quorum' or 'classic', got ${JSON.stringify(d.type)}`);
    declare = { exchange, bindingKeys: [...(bindingKeys as string[])], type };
  }
  return { url, queue, prefetch, declare };
}
