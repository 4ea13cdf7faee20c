/**
 * Opening AMQP connections with errors that say what to fix, and the small
 * helpers the target, the source and the checks share.
 */
import { connect, type Channel, type ChannelModel } from 'amqplib';
import { redactUrl } from './options.ts';

/** How long to wait for TCP + AMQP handshake before giving up on a connect. */
const CONNECT_TIMEOUT_MS = 10_000;

/** An error RabbitMQ sent when it closed a channel or connection (`code` is the AMQP reply code). */
export interface AmqpError extends Error {
  code?: number | string;
}

/** The AMQP reply code of an error (404 NOT_FOUND, 406 PRECONDITION_FAILED, ...), if it has one. */
export function amqpCode(error: unknown): number | null {
  const code = (error as AmqpError | null)?.code;
  return typeof code === 'number' ? code : null;
}

/** The text RabbitMQ sent with an error: `NOT_FOUND - no queue 'x' in vhost '/'`. */
export function serverText(error: unknown): string {
  const message = error instanceof Error ? error.message : String(error);
  const quoted = /with message "(.*)"$/s.exec(message);
  return quoted?.[1] ?? message;
}

/**
 * Opens a connection, naming the URL (password hidden) and the likely fix
 * when it fails. `purpose` shows in RabbitMQ's connection list.
 */
export async function openConnection(url: string, purpose: string): Promise<ChannelModel> {
  let connection: ChannelModel;
  try {
    connection = await connect(url, { timeout: CONNECT_TIMEOUT_MS, clientProperties: { connection_name: `mailroom ${purpose}` } });
  } catch (error) {
    throw connectError(url, error);
  }
  // Without listeners an 'error' event would crash the process; losses are handled through 'close'.
  connection.on('error', () => {});
  return connection;
}

/** Opens a channel whose 'error' events are absorbed (the owner watches 'close'). */
export async function openChannel(connection: ChannelModel): Promise<Channel> {
  const channel = await connection.createChannel();
  channel.on('error', () => {});
  return channel;
}

function connectError(url: string, error: unknown): Error {
  const where = redactUrl(url);
  const reason = error instanceof Error ? error.message : String(error);
  const code = (error as NodeJS.ErrnoException | null)?.code;
  let hint = 'check that RabbitMQ is running and reachable at that address';
  if (code === 'ECONNREFUSED') hint = 'nothing accepts connections there: start RabbitMQ or fix the host and port in the URL';
  else if (code === 'ENOTFOUND' || code === 'EAI_AGAIN') hint = 'the host name does not resolve: fix the host in the URL';
  else if (/ACCESS[-_]REFUSED|403/.test(reason)) hint = 'the user name or password is wrong, or the user may not log in: fix the credentials in the URL';
  else if (/NOT[-_]ALLOWED|530/.test(reason)) hint = 'the virtual host does not exist or the user has no access to it: fix the vhost in the URL or the user\'s permissions';
  else if (/timeout|timed out/i.test(reason)) hint = 'the broker did not answer in time: check the address, the port and any firewall in between';
  return new Error(`rabbitmq: cannot connect to ${where}: ${reason}; ${hint}`, { cause: error });
}

/** Closes a connection, ignoring that it may already be closed; gives up waiting after `waitMs`. */
export async function closeQuietly(connection: ChannelModel | null, waitMs = 2000): Promise<void> {
  if (connection === null) return;
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    connection.close().catch(() => {}),
    new Promise<void>((resolve) => {
      timer = setTimeout(resolve, waitMs);
    }),
  ]);
  clearTimeout(timer);
}

/** Closes a channel, ignoring that it may already be closed. */
export async function closeChannelQuietly(channel: Channel | null): Promise<void> {
  if (channel === null) return;
  try {
    await channel.close();
  } catch {
    // already closed (by the broker or with its connection)
  }
}

/** Reconnect delays: 100 ms doubling up to 5 s. */
export function nextDelay(previousMs: number): number {
  return previousMs <= 0 ? 100 : Math.min(5000, previousMs * 2);
}

/** How long connecting plus declaring may take before it counts as failed. */
export const SETUP_TIMEOUT_MS = 30_000;

/** Rejects with `what` when `promise` does not settle within `ms` (the promise itself is left to settle on its own). */
export async function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`rabbitmq: ${what} took longer than ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
