/**
 * A TCP proxy for the reliability suite (node:net, no dependency): it listens
 * on a free loopback port and forwards each connection to a target, and the
 * test injects network faults between mailroom and PostgreSQL or a broker.
 *
 * - `latency(ms)`: every chunk, both ways, is held `ms` before it is forwarded
 *   (order kept).
 * - `resetAll()`: every open connection is destroyed with a TCP RST on both
 *   sides, as a broken network or a NAT dropping its state would.
 * - `blackhole()`: new connections are accepted and kept but nothing is
 *   forwarded; open ones stall (what they send is held). `heal()` forwards
 *   what was held, in order, and ends the fault (and any latency).
 * - `stallOpen()`: the connections open now stall for good (no reset, nothing
 *   forwarded, not even the server closing them, as after a partition or a
 *   failover that dropped their state), while new ones work; with
 *   `wayBackOnly` only what the server sends stops (and backs up).
 */
import { createServer, connect, type Server, type Socket } from 'node:net';

/** A chunk waiting to be forwarded, not before `due` (ms since epoch). */
interface Held {
  chunk: Buffer;
  due: number;
}

interface Pipe {
  client: Socket;
  upstream: Socket;
  /** Chunks held while the proxy is black-holed (or waiting out latency), in order, per direction. */
  queues: { toUpstream: Held[]; toClient: Held[] };
  closed: boolean;
  /** Stalled for good by `stallOpen()`: what it sends is dropped. */
  stalled: boolean;
  /** The way back cut by `stallOpen({ wayBackOnly })`: the client's close does not reach the server either. */
  cutOff: boolean;
}

export interface FaultProxyStats {
  /** Connections accepted so far. */
  connections: number;
  /** Connections open now. */
  open: number;
  /** Connections destroyed by `resetAll()`. */
  reset: number;
}

export class FaultProxy {
  private readonly pipes = new Set<Pipe>();
  private delayMs = 0;
  private holding = false;
  private accepted = 0;
  private resets = 0;

  private constructor(
    private readonly server: Server,
    /** The port the proxy listens on (127.0.0.1). */
    readonly port: number,
    readonly target: { host: string; port: number },
  ) {}

  /**
   * Starts a proxy on a free loopback port in front of `target`.
   *
   * @example
   * const proxy = await FaultProxy.start({ host: '127.0.0.1', port: 5432 });
   * const url = `postgres://postgres@127.0.0.1:${proxy.port}/test`;
   * proxy.blackhole(); await sleep(3000); proxy.heal();
   * await proxy.close();
   */
  static async start(target: { host: string; port: number }): Promise<FaultProxy> {
    let proxy: FaultProxy | undefined;
    const server = createServer({ noDelay: true }, (client) => proxy!.accept(client));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, '127.0.0.1', () => resolve());
    });
    const address = server.address();
    if (typeof address !== 'object' || address === null) throw new Error('fault proxy: the server has no port');
    proxy = new FaultProxy(server, address.port, target);
    return proxy;
  }

  /** Holds every chunk `ms` before forwarding it (0: none). */
  latency(ms: number): void {
    if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`fault proxy: latency must be a number of ms >= 0, got ${ms}`);
    this.delayMs = ms;
  }

  /** Destroys every open connection with a TCP RST on both sides; returns how many there were. */
  resetAll(): number {
    let n = 0;
    for (const pipe of [...this.pipes]) {
      n++;
      this.teardown(pipe, true);
    }
    this.resets += n;
    return n;
  }

  /** Accepts and keeps connections but forwards nothing, and stalls open ones, until `heal()`. */
  blackhole(): void {
    this.holding = true;
  }

  /**
   * Stalls every connection open now for good (no reset: both ends still think it open); new
   * connections work. Returns how many. `wayBackOnly`: what the client sends still reaches the
   * server, but the proxy stops reading what the server sends, so a server writing an answer larger
   * than the sockets' buffers blocks in the write (`ClientWrite`), as one does when a partition cuts
   * the way back to the client; the client closing the connection then does not reach the server.
   */
  stallOpen(options: { wayBackOnly?: boolean } = {}): number {
    for (const pipe of this.pipes) {
      if (options.wayBackOnly) {
        pipe.upstream.pause();
        pipe.cutOff = true;
      } else pipe.stalled = true;
    }
    return this.pipes.size;
  }

  /** Ends every fault: no latency, and what a black hole held is forwarded in order. */
  heal(): void {
    this.holding = false;
    this.delayMs = 0;
    for (const pipe of this.pipes) this.flush(pipe);
  }

  stats(): FaultProxyStats {
    return { connections: this.accepted, open: this.pipes.size, reset: this.resets };
  }

  /** Stops listening and destroys every connection. */
  async close(): Promise<void> {
    for (const pipe of [...this.pipes]) this.teardown(pipe, false);
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private accept(client: Socket): void {
    this.accepted++;
    const upstream = connect({ host: this.target.host, port: this.target.port, noDelay: true });
    const pipe: Pipe = { client, upstream, queues: { toUpstream: [], toClient: [] }, closed: false, stalled: false, cutOff: false };
    this.pipes.add(pipe);
    client.on('data', (chunk) => this.forward(pipe, 'toUpstream', chunk));
    upstream.on('data', (chunk) => this.forward(pipe, 'toClient', chunk));
    // Either side ending or failing ends the pair (a refused upstream looks like a reset to the client);
    // the server ending a stalled connection does not reach the client either, as after a failover.
    client.on('error', () => (pipe.cutOff ? client.destroy() : this.teardown(pipe, true)));
    client.on('close', () => (pipe.cutOff ? undefined : this.teardown(pipe, false)));
    upstream.on('error', () => (pipe.stalled ? upstream.destroy() : this.teardown(pipe, true)));
    upstream.on('close', () => (pipe.stalled ? undefined : this.teardown(pipe, false)));
  }

  private forward(pipe: Pipe, direction: 'toUpstream' | 'toClient', chunk: Buffer): void {
    if (pipe.stalled) return;
    const queue = pipe.queues[direction];
    if (!this.holding && queue.length === 0 && this.delayMs === 0) {
      this.write(pipe, direction, chunk);
      return;
    }
    // Behind what is already held, so order is kept.
    queue.push({ chunk, due: Date.now() + this.delayMs });
    if (!this.holding && queue.length === 1) setTimeout(() => this.flush(pipe), this.delayMs);
  }

  /** Forwards every held chunk that is due; waits for the next one. */
  private flush(pipe: Pipe): void {
    if (this.holding || pipe.closed) return;
    for (const direction of ['toUpstream', 'toClient'] as const) {
      const queue = pipe.queues[direction];
      const now = Date.now();
      while (queue.length > 0 && (queue[0]!.due <= now || this.delayMs === 0)) this.write(pipe, direction, queue.shift()!.chunk);
      if (queue.length > 0) setTimeout(() => this.flush(pipe), queue[0]!.due - now);
    }
  }

  private write(pipe: Pipe, direction: 'toUpstream' | 'toClient', chunk: Buffer): void {
    const to = direction === 'toUpstream' ? pipe.upstream : pipe.client;
    if (!pipe.closed && !to.destroyed) to.write(chunk);
  }

  private teardown(pipe: Pipe, reset: boolean): void {
    if (pipe.closed) return;
    pipe.closed = true;
    this.pipes.delete(pipe);
    for (const socket of [pipe.client, pipe.upstream]) {
      if (socket.destroyed) continue;
      if (reset && typeof socket.resetAndDestroy === 'function' && !socket.connecting) socket.resetAndDestroy();
      else socket.destroy();
    }
  }
}
