/**
 * Opening a NATS connection for an adapter: no automatic reconnect (the
 * adapter decides when to connect again, so nothing is buffered and resent
 * out of order), fast ping-based detection of a dead server, and errors that
 * name the server.
 */
import { connect, type NatsConnection } from '@nats-io/transport-node';

/** The servers as they may be printed: passwords and tokens replaced by `***`. */
export function describeServers(servers: readonly string[]): string {
  return servers
    .map((s) => {
      try {
        const u = new URL(s.includes('://') ? s : `nats://${s}`);
        if (u.password) u.password = '***';
        else if (u.username) u.username = '***';
        return s.includes('://') ? u.toString().replace(/\/$/, '') : u.host;
      } catch {
        return s;
      }
    })
    .join(', ');
}

/** What went wrong, as text, without the stack. */
export function reason(error: unknown): string {
  if (error instanceof Error) {
    const cause = error.cause instanceof Error && error.cause.message !== error.message ? ` (${error.cause.message})` : '';
    return `${error.message}${cause}`;
  }
  return String(error);
}

/**
 * Connects to one of `servers`, or rejects with an error naming them.
 *
 * @example
 * const nc = await openConnection(['nats://127.0.0.1:4222'], 'mailroom relay nats:orders');
 */
export async function openConnection(servers: readonly string[], name: string): Promise<NatsConnection> {
  try {
    return await connect({
      servers: [...servers],
      name,
      reconnect: false,
      timeout: 5_000,
      pingInterval: 5_000,
      maxPingOut: 3,
      // Without this the client captures two stack traces per request (a third of a publish's CPU).
      noAsyncTraces: true,
    });
  } catch (error) {
    throw new Error(
      `nats: cannot connect to ${describeServers(servers)}: ${reason(error)}; check that nats-server is running with JetStream (-js) and that the url is right`,
      { cause: error },
    );
  }
}

/** Closes a connection after flushing what was written to it (acks, naks); never throws. */
export async function closeQuietly(nc: NatsConnection | null): Promise<void> {
  if (!nc || nc.isClosed()) return;
  try {
    await Promise.race([nc.flush(), new Promise((resolve) => setTimeout(resolve, 1_000).unref())]);
  } catch {
    // a dead connection has nothing left to flush
  }
  try {
    await nc.close();
  } catch {
    // already closed
  }
}
