/**
 * Safety checks over plain AMQP (no management plugin). A failed passive or
 * equivalence declare closes the channel it was sent on, so every probe gets
 * a throwaway channel of its own.
 */
import type { ChannelModel } from 'amqplib';
import type { SafetyWarning } from '../safety.ts';
import { amqpCode, closeChannelQuietly, openChannel, serverText } from './connection.ts';
import { redactUrl } from './options.ts';

const NOT_FOUND = 404;
const RESOURCE_LOCKED = 405;
const PRECONDITION_FAILED = 406;

/** Whether a queue or exchange exists, by a passive declare. */
export async function exists(connection: ChannelModel, kind: 'queue' | 'exchange', name: string): Promise<boolean> {
  const channel = await openChannel(connection);
  try {
    if (kind === 'queue') await channel.checkQueue(name);
    else await channel.checkExchange(name);
    return true;
  } catch (error) {
    const code = amqpCode(error);
    if (code === NOT_FOUND) return false;
    if (code === RESOURCE_LOCKED) return true; // an exclusive queue of another connection
    throw error;
  } finally {
    await closeChannelQuietly(channel);
  }
}

/** What the equivalence probe found out about a queue's poison-message protection. */
export type RetryLimit =
  | { kind: 'missing' }
  | { kind: 'limited'; argument: 'x-delivery-limit' | 'x-dead-letter-exchange' }
  /** A delivery limit and no dead-letter exchange: a message past the limit is dropped. `implicit`: RabbitMQ 4's default limit on quorum queues. */
  | { kind: 'drops'; limit: number | null; implicit: boolean }
  | { kind: 'unlimited'; arguments: Readonly<Record<string, unknown>> }
  /** A stream: consumers read by offset, nothing is requeued, so a delivery limit does not apply. */
  | { kind: 'stream' }
  | { kind: 'unknown'; reason: string };

type ArgumentValue = string | number | boolean;

const INEQUIVALENT = /inequivalent arg '([^']+)' for queue .*?: received (.*?) but current is (.*)$/s;
const CURRENT_TYPED = /^the value '(.*)' of type '([a-z]+)'$/s;
const NUMERIC_TYPES = new Set(['byte', 'unsignedbyte', 'short', 'unsignedshort', 'signedint', 'unsignedint', 'long', 'double', 'float', 'timestamp']);
const MAX_PROBES = 20;

function decodeCurrent(text: string, sent: ArgumentValue | undefined): ArgumentValue | undefined {
  const typed = CURRENT_TYPED.exec(text);
  if (!typed) {
    // `received 'a' but current is 'b'`: same type as what was sent
    const plain = /^'(.*)'$/s.exec(text)?.[1];
    if (plain === undefined || sent === undefined) return undefined;
    if (typeof sent === 'number') return Number.isFinite(Number(plain)) ? Number(plain) : undefined;
    if (typeof sent === 'boolean') return plain === 'true';
    return plain;
  }
  const [, raw = '', type] = typed;
  if (type === 'longstr') return raw;
  if (type === 'bool') return raw === 'true';
  if (type !== undefined && NUMERIC_TYPES.has(type)) {
    const n = Number(raw);
    return Number.isFinite(n) ? n : undefined;
  }
  return undefined;
}

/**
 * Finds out whether a queue has a delivery limit or a dead-letter exchange,
 * from RabbitMQ's declare-equivalence check: a declare of an existing queue
 * succeeds only when its properties and arguments match. Starting from a
 * plain durable queue, each PRECONDITION_FAILED names one argument that
 * differs and its current value; the probe adopts that value and declares
 * again, until the declare succeeds: the arguments adopted then are the
 * queue's, and say whether it has a delivery limit, a dead-letter exchange,
 * both or neither. Limits set by a policy are invisible to it.
 */
export async function probeRetryLimit(connection: ChannelModel, queue: string): Promise<RetryLimit> {
  if (!(await exists(connection, 'queue', queue))) return { kind: 'missing' };
  // RabbitMQ 4.0 gave quorum queues a default delivery limit (20) that their arguments do not show.
  const major = Number.parseInt(String(connection.connection.serverProperties.version ?? '0'), 10);
  const args: Record<string, ArgumentValue> = {};
  let durable = true;
  let autoDelete = false;
  for (let probe = 0; probe < MAX_PROBES; probe++) {
    const channel = await openChannel(connection);
    try {
      await channel.assertQueue(queue, { durable, autoDelete, arguments: { ...args } });
      return judge(args, args['x-queue-type'] === 'quorum' && major >= 4);
    } catch (error) {
      const code = amqpCode(error);
      const text = serverText(error);
      if (code === RESOURCE_LOCKED) return { kind: 'unknown', reason: `the queue is exclusive to another connection (${text})` };
      if (code !== PRECONDITION_FAILED) return { kind: 'unknown', reason: text };
      const match = INEQUIVALENT.exec(text);
      if (!match) return { kind: 'unknown', reason: text };
      const [, name = '', , current = ''] = match;
      if (name === 'durable' || name === 'auto_delete') {
        const value = /^'(true|false)'$/.exec(current)?.[1];
        if (value === undefined) return { kind: 'unknown', reason: text };
        if (name === 'durable') durable = value === 'true';
        else autoDelete = value === 'true';
        continue;
      }
      if (current === 'none') {
        delete args[name];
        continue;
      }
      const value = decodeCurrent(current, args[name]);
      if (value === undefined) return { kind: 'unknown', reason: `cannot read the current value of ${name} from: ${text}` };
      if (name === 'x-queue-type' && value === 'stream') return { kind: 'stream' };
      args[name] = value;
    } finally {
      await closeChannelQuietly(channel);
    }
  }
  return { kind: 'unknown', reason: `the queue's arguments did not settle after ${MAX_PROBES} declares` };
}

/**
 * What a queue's settled arguments say: a dead-letter exchange catches what
 * its consumers reject (and, with a delivery limit, what they fail too often);
 * a delivery limit without one drops those messages; neither redelivers a
 * poison message forever. `quorumDefault`: RabbitMQ 4 gives quorum queues a
 * delivery limit (20) their arguments do not show.
 */
function judge(args: Readonly<Record<string, ArgumentValue>>, quorumDefault: boolean): RetryLimit {
  const limit = args['x-delivery-limit'];
  if (args['x-dead-letter-exchange'] !== undefined) return { kind: 'limited', argument: 'x-dead-letter-exchange' };
  if (limit !== undefined) return { kind: 'drops', limit: typeof limit === 'number' ? limit : Number(limit), implicit: false };
  if (quorumDefault) return { kind: 'drops', limit: null, implicit: true };
  return { kind: 'unlimited', arguments: { ...args } };
}

/** `rabbitmq-limit-drops`: a queue with a delivery limit and no dead-letter exchange drops what passes the limit. */
export function limitDrops(url: string, queue: string, limit: { limit: number | null; implicit: boolean }): SafetyWarning {
  const which = limit.implicit ? 'the delivery limit RabbitMQ 4 gives every quorum queue (20)' : `a delivery limit (x-delivery-limit ${limit.limit})`;
  return {
    subject: subjectOf(url, 'queue', queue),
    code: 'rabbitmq-limit-drops',
    message:
      `the queue '${queue}' has ${which} but no dead-letter exchange: a message its consumers fail that many times is dropped, ` +
      `and the event is lost for them without a trace. Give the queue an x-dead-letter-exchange (an argument or a dead-letter-exchange policy), ` +
      `with dead-letter-strategy at-least-once and overflow reject-publish on a quorum queue so that dead-lettering loses nothing either. ` +
      `A dead-letter exchange set only by a policy is invisible to this check: ignore the warning if a policy covers the queue.`,
  };
}

/** The `subject` of a warning about an exchange or queue on a broker. */
export function subjectOf(url: string, kind: 'exchange' | 'queue', name: string): string {
  return `rabbitmq ${redactUrl(url)} ${kind} ${name}`;
}

/** `rabbitmq-exchange-missing`: the target publishes to an exchange it does not declare and that does not exist. */
export function exchangeMissing(url: string, exchange: string): SafetyWarning {
  return {
    subject: subjectOf(url, 'exchange', exchange),
    code: 'rabbitmq-exchange-missing',
    message:
      `the exchange '${exchange}' does not exist and the target has declare: false, so every publish fails (the channel is closed with NOT_FOUND) ` +
      `and events wait in the outbox. Create the exchange (a durable topic exchange), or let the target declare it (declare: true).`,
  };
}

/** `rabbitmq-queue-missing`: a queue the source reads (or `checkQueues` names) does not exist. */
export function queueMissing(url: string, queue: string, role: 'source' | 'checkQueues'): SafetyWarning {
  const message =
    role === 'source'
      ? `the queue '${queue}' does not exist and the source has no declare option, so the consumer cannot start. ` +
        `Create the queue and bind it to the exchange, or give the source declare: { exchange } to declare and bind it.`
      : `the queue '${queue}' named in checkQueues does not exist, so its delivery limit cannot be checked and nothing consumes from it. ` +
        `Fix the name in checkQueues, or create the queue.`;
  return { subject: subjectOf(url, 'queue', queue), code: 'rabbitmq-queue-missing', message };
}

/** `rabbitmq-no-delivery-limit`: a queue other services consume redelivers a poison message forever. */
export function noDeliveryLimit(url: string, queue: string): SafetyWarning {
  return {
    subject: subjectOf(url, 'queue', queue),
    code: 'rabbitmq-no-delivery-limit',
    message:
      `the queue '${queue}' has neither a delivery limit (x-delivery-limit) nor a dead-letter exchange (x-dead-letter-exchange): ` +
      `a message its consumers cannot process is requeued and redelivered forever, blocking or slowing everything behind it. ` +
      `Make it a quorum queue with x-delivery-limit and an x-dead-letter-exchange (as queue arguments or a policy: delivery-limit, dead-letter-exchange). ` +
      `A limit set only by a policy is invisible to this check: ignore the warning if a policy covers the queue.`,
  };
}

/** `rabbitmq-check-inconclusive`: a probe could not tell. */
export function checkInconclusive(url: string, queue: string, reason: string): SafetyWarning {
  return {
    subject: subjectOf(url, 'queue', queue),
    code: 'rabbitmq-check-inconclusive',
    message:
      `could not tell whether the queue '${queue}' has a delivery limit or a dead-letter exchange: ${reason}. ` +
      `The check re-declares the queue with its own arguments, which needs the 'configure' permission on it and a non-exclusive queue; ` +
      `check the queue's arguments and policies by hand (rabbitmqctl list_queues name arguments policy).`,
  };
}
