import { ValidationError } from '../errors.ts';

/** Lower-case dotted names: at least two segments of letters, digits, `_` or `-`, each starting with a letter. */
const EVENT_TYPE = /^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)+$/;
const MAX_TYPE_LENGTH = 128;

/** Verbs that make a name read as a command (`create.order`, `order.send-email`) rather than a fact. */
const IMPERATIVE_VERBS = new Set([
  'add', 'apply', 'approve', 'assign', 'calculate', 'cancel', 'capture', 'change', 'charge', 'compute', 'confirm', 'create',
  'delete', 'deliver', 'dispatch', 'do', 'emit', 'enqueue', 'execute', 'fetch', 'fire', 'generate', 'get', 'handle',
  'insert', 'invite', 'make', 'notify', 'pay', 'process', 'publish', 'push', 'refund', 'register', 'reject', 'remove',
  'reserve', 'save', 'send', 'ship', 'start', 'stop', 'submit', 'sync', 'trigger', 'update', 'upload', 'validate', 'verify',
]);

/** Past participles that do not end in -ed. */
const IRREGULAR_PAST = new Set(['sent', 'paid', 'made', 'done', 'built', 'sold', 'bought', 'held', 'left', 'lost', 'won', 'begun', 'given', 'taken', 'written', 'shut', 'put', 'set', 'read']);

function firstWord(segment: string): string {
  return segment.split(/[-_]/)[0]!;
}

function readsAsPast(segment: string): boolean {
  return segment.split(/[-_]/).some((word) => word.endsWith('ed') || IRREGULAR_PAST.has(word));
}

/**
 * The imperative verb that makes a type read as a command, or undefined when
 * it reads as a fact: the last segment starts with a verb (`order.send-email`,
 * `order.create`), or the first does and the last is not in the past tense
 * (`create.order`; `charge.succeeded` is a fact about a charge).
 *
 * @example
 * imperativeVerbOf('order.send-email') // 'send'
 * imperativeVerbOf('order.created')    // undefined
 */
export function imperativeVerbOf(type: string): string | undefined {
  const segments = type.split('.');
  const last = firstWord(segments.at(-1)!);
  if (IMPERATIVE_VERBS.has(last)) return last;
  const first = firstWord(segments[0]!);
  if (IMPERATIVE_VERBS.has(first) && !readsAsPast(segments.at(-1)!)) return first;
  return undefined;
}

const warned = new Set<string>();

/** Warns once per type (console.warn) when a type reads as a command; events are facts, named in the past tense. */
export function warnIfImperative(type: string): void {
  const verb = imperativeVerbOf(type);
  if (verb === undefined || warned.has(type)) return;
  warned.add(type);
  console.warn(
    `[mailroom] event type "${type}" reads as a command ("${verb}"); events are facts that already happened: name them in the past tense, e.g. "order.created", "email.sent"`,
  );
}

/**
 * Validates an event type: lower-case dotted segments such as `order.created`
 * or `billing.invoice-paid`, at most 128 characters. Throws a ValidationError
 * naming the type otherwise.
 *
 * @example
 * assertEventType('order.created') // ok
 * assertEventType('OrderCreated')  // ValidationError
 */
export function assertEventType(type: unknown): asserts type is string {
  if (typeof type !== 'string' || type.length > MAX_TYPE_LENGTH || !EVENT_TYPE.test(type)) {
    const verb = typeof type === 'string' ? imperativeVerbOf(type.toLowerCase()) : undefined;
    const hint = verb ? `; it also reads as a command ("${verb}"): events are facts, name them in the past tense` : '';
    throw new ValidationError(
      `event type ${JSON.stringify(type)} is not valid; use lower-case dotted names with at least two segments of letters, digits, '_' or '-', each starting with a letter, at most ${MAX_TYPE_LENGTH} characters (e.g. 'order.created')${hint}`,
      [{ path: 'type', message: 'invalid event type' }],
    );
  }
}
