/**
 * The NATS JetStream fixture of the shared broker adapter suite: a stream and
 * a durable pull consumer per pair, on the server at NATS_URL or (restartable
 * pairs) on a private nats-server with its own store directory and port.
 */
import { readFileSync } from 'node:fs';
import { freePort } from './free-port.ts';
export { freePort };
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AckPolicy, DeliverPolicy, jetstream, jetstreamManager, StorageType, type JetStreamManager } from '@nats-io/jetstream';
import { connect, headers as natsHeaders, nanos, type NatsConnection } from '@nats-io/transport-node';
import { nats, natsSource, type NatsSource, type NatsTarget } from '../../../src/brokers/nats/index.ts';
import type { BrokerFixture, BrokerPair, PairDescription, RawPublisher } from './fixture.ts';

/** The nats-server binary (override with NATS_SERVER_BIN). */
export const NATS_SERVER_BIN = process.env.NATS_SERVER_BIN ?? '/usr/sbin/nats-server';
/** How long `restart()` keeps a private server down. */
export const RESTART_DOWN_MS = 1_000;
/** AckWait of the pairs' consumers: short, so a message of a killed consumer comes back within a test. */
export const PAIR_ACK_WAIT_MS = 5_000;


/** Resolves once a JetStream request on `url` succeeds (the server is up and has recovered its streams). */
export async function waitForJetStream(url: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown = null;
  while (Date.now() < deadline) {
    let nc: NatsConnection | null = null;
    try {
      nc = await connect({ servers: url, reconnect: false, timeout: 1_000 });
      const jsm = await jetstreamManager(nc, { timeout: 2_000 });
      await jsm.getAccountInfo();
      return;
    } catch (error) {
      last = error;
      await new Promise((r) => setTimeout(r, 50));
    } finally {
      await nc?.close().catch(() => undefined);
    }
  }
  throw new Error(`nats-server at ${url} did not accept JetStream requests within ${timeoutMs} ms: ${String(last)}`);
}

/**
 * A private `nats-server -js` on a free port with a store directory of its own,
 * which a test may stop, kill and start again (same port, same store).
 */
export class PrivateNatsServer {
  readonly port: number;
  readonly dir: string;
  #child: ChildProcess | null = null;

  private constructor(port: number, dir: string) {
    this.port = port;
    this.dir = dir;
  }

  /** Starts a new server and resolves once JetStream answers. */
  static async create(): Promise<PrivateNatsServer> {
    const server = new PrivateNatsServer(await freePort(), await mkdtemp(join(tmpdir(), 'mailroom-nats-')));
    await server.start();
    return server;
  }

  get url(): string {
    return `nats://127.0.0.1:${this.port}`;
  }

  get running(): boolean {
    return this.#child !== null;
  }

  async start(): Promise<void> {
    if (this.#child) return;
    const child = spawn(NATS_SERVER_BIN, ['-a', '127.0.0.1', '-p', String(this.port), '-js', '-sd', this.dir], { stdio: 'ignore' });
    this.#child = child;
    child.once('exit', () => {
      if (this.#child === child) this.#child = null;
    });
    await waitForJetStream(this.url);
  }

  /** Stops the server (SIGTERM, or `signal`) and resolves once it has exited. */
  async stop(signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    const child = this.#child;
    if (!child) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.kill(signal);
    const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(timer);
    this.#child = null;
  }

  /**
   * Stops the server, keeps it down for `downMs` (a real restart is not
   * instant: clients must meet the outage, not slip through a 20 ms gap),
   * starts it again and resolves once JetStream answers.
   */
  async restart(downMs = RESTART_DOWN_MS): Promise<void> {
    await this.stop();
    await new Promise((r) => setTimeout(r, downMs));
    await this.start();
  }

  /** Sends `signal` without waiting (SIGSTOP stalls the server, SIGCONT resumes it). */
  signal(signal: NodeJS.Signals): void {
    const child = this.#child;
    child?.kill(signal);
    // Under load a signal can take a moment to land: make SIGSTOP mean "stopped" before the test goes on.
    if (signal === 'SIGSTOP' && child?.pid !== undefined) {
      const deadline = Date.now() + 2000;
      while (Date.now() < deadline && !/\) T /.test(readFileSync(`/proc/${child.pid}/stat`, 'utf8'))) {
        /* a few microseconds usually */
      }
    }
  }

  /** Stops the server and removes its store. */
  async destroy(): Promise<void> {
    await this.stop();
    await rm(this.dir, { recursive: true, force: true });
  }
}

/** Runs `fn` with a JetStream manager on a connection of its own. */
export async function withJsm<T>(url: string, fn: (jsm: JetStreamManager, nc: NatsConnection) => Promise<T>): Promise<T> {
  const nc = await connect({ servers: url, reconnect: false, timeout: 5_000 });
  try {
    return await fn(await jetstreamManager(nc), nc);
  } finally {
    await nc.close();
  }
}

interface PairSpec {
  url: string;
  stream: string;
  durable: string;
  ackWaitMs: number;
}

function sourceOf(spec: PairSpec, prefetch?: number): NatsSource {
  return natsSource({
    url: spec.url,
    stream: spec.stream,
    durable: spec.durable,
    ackWait: spec.ackWaitMs,
    from: 'earliest',
    ...(prefetch === undefined ? {} : { prefetch }),
  });
}

/** Creates the pair's stream (as the target declares it) and its durable consumer (as the source creates it, from the start of the stream). */
async function createDestination(spec: PairSpec): Promise<void> {
  await withJsm(spec.url, async (jsm) => {
    await jsm.streams.add({ name: spec.stream, subjects: [`${spec.stream}.>`], storage: StorageType.File, duplicate_window: nanos(120_000) });
    await jsm.consumers.add(spec.stream, {
      durable_name: spec.durable,
      ack_policy: AckPolicy.Explicit,
      deliver_policy: DeliverPolicy.All,
      max_deliver: -1,
      ack_wait: nanos(spec.ackWaitMs),
    });
  });
}

async function rawPublisher(spec: PairSpec): Promise<RawPublisher> {
  const nc = await connect({ servers: spec.url, reconnect: false, timeout: 5_000 });
  const js = jetstream(nc);
  return {
    async publish(body, options = {}) {
      const h = natsHeaders();
      for (const [name, value] of Object.entries(options.headers ?? {})) h.set(name, value);
      await js.publish(`${spec.stream}.raw`, body, {
        headers: h,
        expect: { streamName: spec.stream },
        ...(options.messageId === undefined ? {} : { msgID: options.messageId }),
      });
    },
    async close() {
      await nc.close();
    },
  };
}

/**
 * Messages of the stream the durable has not acknowledged: not yet delivered
 * (num_pending) plus delivered and unacked (num_ack_pending). The server
 * applies acks asynchronously, so a non-zero count is read again until it
 * holds still.
 */
async function pendingOf(spec: PairSpec): Promise<number> {
  return withJsm(spec.url, async (jsm) => {
    let last = -1;
    for (let i = 0; i < 5; i++) {
      const info = await jsm.consumers.info(spec.stream, spec.durable);
      const count = info.num_pending + info.num_ack_pending;
      if (count === 0 || count === last) return count;
      last = count;
      await new Promise((r) => setTimeout(r, 50));
    }
    return last;
  });
}

/** A pair with what the NATS tests also need: its names and its private server, if any. */
export interface NatsPair extends BrokerPair {
  readonly stream: string;
  readonly durable: string;
  readonly url: string;
  /** The private server of a restartable pair (null on NATS_URL). */
  readonly server: PrivateNatsServer | null;
}

/** `fixture.pair()` with the NATS specifics visible. */
export async function natsPair(unique: string, options: { restartable?: boolean } = {}): Promise<NatsPair> {
  const shared = process.env.NATS_URL ?? null;
  if (shared === null) throw new Error('NATS_URL is not set');
  const server = options.restartable ? await PrivateNatsServer.create() : null;
  const spec: PairSpec = { url: server?.url ?? shared, stream: `mr-${unique}`, durable: `g-${unique}`, ackWaitMs: PAIR_ACK_WAIT_MS };
  const targets: NatsTarget[] = [];
  const sources: NatsSource[] = [];
  const raws: RawPublisher[] = [];
  try {
    await createDestination(spec);
  } catch (error) {
    await server?.destroy();
    throw error;
  }
  const pair: NatsPair = {
    stream: spec.stream,
    durable: spec.durable,
    url: spec.url,
    server,
    target() {
      const t = nats({ url: spec.url, stream: spec.stream, ackTimeout: '10s' });
      targets.push(t);
      return t;
    },
    source(o = {}) {
      const s = sourceOf(spec, o.prefetch);
      sources.push(s);
      return s;
    },
    async raw() {
      const r = await rawPublisher(spec);
      raws.push(r);
      return r;
    },
    pending: () => pendingOf(spec),
    async restart() {
      if (!server) throw new Error(`nats pair ${unique} was not made with restartable: true`);
      await server.restart();
    },
    describe: (): PairDescription => ({ url: spec.url, stream: spec.stream, durable: spec.durable, ackWaitMs: spec.ackWaitMs }),
    async cleanup() {
      await Promise.allSettled([...sources.map((s) => s.stop()), ...targets.map((t) => t.close()), ...raws.map((r) => r.close())]);
      if (server) {
        await server.destroy();
      } else {
        await withJsm(spec.url, (jsm) => jsm.streams.delete(spec.stream)).catch(() => undefined);
      }
    },
  };
  return pair;
}

export const fixture: BrokerFixture = {
  kind: 'nats',
  url: process.env.NATS_URL ?? null,
  pair: natsPair,
  sourceFrom(description, options = {}) {
    const { url, stream, durable, ackWaitMs } = description;
    if (typeof url !== 'string' || typeof stream !== 'string' || typeof durable !== 'string' || typeof ackWaitMs !== 'number') {
      throw new Error(`not a nats pair description: ${JSON.stringify(description)}`);
    }
    return sourceOf({ url, stream, durable, ackWaitMs }, options.prefetch);
  },
};
