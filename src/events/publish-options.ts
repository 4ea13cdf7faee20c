import { ValidationError } from '../errors.ts';
import { checkOptionNames, type OptionNames } from '../option-names.ts';
import type { TransactionLike } from '../storage/driver.ts';
import { hasLoneSurrogate, LONE_SURROGATE_FIX } from '../payload.ts';
import { RESERVED_ATTRIBUTES } from './envelope.ts';

/** Options of `publish`. */
export interface PublishOptions {
  /** Publish inside this transaction (a node-postgres client inside BEGIN, a PGlite transaction, `mailroom.transaction`'s tx or `ctx.tx`): the event exists if and only if it commits. */
  tx?: TransactionLike;
  /** The aggregate key (order id, account id): events of one key reach consumers in commit order. CloudEvents `subject`. At most 256 characters. */
  key?: string;
  /** Carried to every consumer's job, its logs and history. */
  correlationId?: string;
  /** The id of the event or command that caused this one. */
  causationId?: string;
  /** Extra CloudEvents extension attributes: names of 1-20 lower-case letters or digits, string values. */
  headers?: Record<string, string>;
  /** W3C trace context (`00-<trace id>-<parent id>-<flags>`). */
  traceparent?: string;
  /** When it happened. Default: now. */
  time?: Date;
  /**
   * Without `tx`: ends the publish when aborted (its statement cancelled on
   * the server, nothing written) and rejects with the signal's reason. Not
   * with `tx`: give the signal to `mailroom.transaction(fn, { signal })`.
   */
  signal?: AbortSignal;
}

/** Options of `publishMany`: like {@link PublishOptions}, with the key per item. */
export interface PublishManyOptions<TInput> extends Omit<PublishOptions, 'key'> {
  key?: string | ((data: TInput, index: number) => string);
}

/** Options with everything validated. */
export interface CheckedPublishOptions {
  correlationId: string | null;
  causationId: string | null;
  traceparent: string | null;
  headers: string | null;
  time: Date;
}

export const MAX_KEY_LENGTH = 256;
const MAX_ID_LENGTH = 256;
const MAX_HEADERS = 20;
const MAX_HEADER_VALUE = 1024;
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$/;
const EXTENSION_NAME = /^[a-z0-9]{1,20}$/;

function invalid(path: string, message: string): ValidationError {
  return new ValidationError(message, [{ path, message }]);
}

function text(value: unknown, path: string, max: number): string | null {
  if (value === undefined || value === null) return null;
  if (typeof value !== 'string' || value.length === 0 || value.length > max || value.includes('\u0000')) {
    const got = typeof value === 'string' ? `${value.length} characters` : typeof value;
    throw invalid(path, `publish: ${path} must be a non-empty string of at most ${max} characters without NUL, got ${got}`);
  }
  if (hasLoneSurrogate(value)) {
    throw invalid(path, `publish: ${path} ${LONE_SURROGATE_FIX}`);
  }
  return value;
}

/**
 * Validates an event key (string, 1-256 characters, no NUL); `what` names it in the error.
 *
 * @example
 * checkKey('order-42', 'key') // 'order-42'
 */
export function checkKey(value: unknown, what: string): string | null {
  return text(value, what, MAX_KEY_LENGTH);
}

function checkTraceparent(value: unknown): string | null {
  if (value === undefined || value === null) return null;
  const match = typeof value === 'string' ? TRACEPARENT.exec(value) : null;
  if (!match || match[1] === 'ff' || /^0+$/.test(match[2]!) || /^0+$/.test(match[3]!)) {
    throw invalid('traceparent', `publish: traceparent must be a W3C trace context like '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', got ${typeof value === 'string' ? JSON.stringify(value) : typeof value}`);
  }
  return value as string;
}

function checkHeaders(value: unknown): string | null {
  if (value === undefined || value === null) return null;
  const proto = typeof value === 'object' ? Object.getPrototypeOf(value) : undefined;
  if (typeof value !== 'object' || Array.isArray(value) || (proto !== Object.prototype && proto !== null)) {
    const got = value instanceof Map ? 'a Map (use a plain object, e.g. Object.fromEntries(map))' : Array.isArray(value) ? 'an array' : typeof value === 'object' ? 'an object that is not a plain object' : typeof value;
    throw invalid('headers', `publish: headers must be a plain object of name -> string value, got ${got}`);
  }
  const entries = Object.entries(value);
  if (entries.length > MAX_HEADERS) throw invalid('headers', `publish: at most ${MAX_HEADERS} headers, got ${entries.length}`);
  for (const [name, v] of entries) {
    if (!EXTENSION_NAME.test(name) || RESERVED_ATTRIBUTES.has(name)) {
      throw invalid(
        `headers.${name}`,
        `publish: header name ${JSON.stringify(name)} is not a valid CloudEvents extension name; use 1-20 lower-case letters or digits, not one of ${[...RESERVED_ATTRIBUTES].join(', ')}`,
      );
    }
    text(v, `headers.${name}`, MAX_HEADER_VALUE);
  }
  return entries.length === 0 ? null : JSON.stringify(value);
}

function checkTime(value: unknown): Date {
  if (value === undefined) return new Date();
  if (!(value instanceof Date) || Number.isNaN(value.getTime()) || value.getUTCFullYear() < 1970 || value.getUTCFullYear() > 9999) {
    throw invalid('time', 'publish: time must be a valid Date between 1970 and 9999');
  }
  return value;
}

const PUBLISH_OPTION_NAMES: OptionNames<PublishOptions> = { tx: true, key: true, correlationId: true, causationId: true, headers: true, traceparent: true, time: true, signal: true };

/** Validates the options every event of one publish shares. */
export function checkPublishOptions<TInput>(options: PublishOptions | PublishManyOptions<TInput>): CheckedPublishOptions {
  checkOptionNames(options, PUBLISH_OPTION_NAMES, 'publish');
  if (typeof options !== 'object' || options === null) throw invalid('options', 'publish: options must be an object');
  return {
    correlationId: text(options.correlationId, 'correlationId', MAX_ID_LENGTH),
    causationId: text(options.causationId, 'causationId', MAX_ID_LENGTH),
    traceparent: checkTraceparent(options.traceparent),
    headers: checkHeaders(options.headers),
    time: checkTime(options.time),
  };
}
