/**
 * A private RabbitMQ node for the tests that stop, restart or stall a broker:
 * its own node name, AMQP and distribution ports, data directory and Erlang
 * cookie, so that the machine's shared server (RABBITMQ_URL), which other test
 * files use at the same time (`--test-concurrency`), is never disturbed.
 * Starting one takes a few seconds; stop it when done.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, mkdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { connect } from 'amqplib';
import { freePort } from './free-port.ts';

const run = promisify(execFile);

/** Where the server's own scripts are (the Debian package's `/usr/sbin` wrappers switch user and read /etc/rabbitmq). */
export const RABBITMQ_BIN_DIR = process.env.RABBITMQ_BIN_DIR ?? '/usr/lib/rabbitmq/bin';

let started = 0;

/** `rabbitmq-server` on free ports with a data directory of its own; see the file's comment. */
export class PrivateRabbitNode {
  private child: ChildProcess | null = null;

  private constructor(
    readonly node: string,
    readonly port: number,
    private readonly dir: string,
    private readonly env: NodeJS.ProcessEnv,
  ) {}

  /** `amqp://guest:guest@127.0.0.1:<port>` (guest may connect over loopback). */
  get url(): string {
    return `amqp://guest:guest@127.0.0.1:${this.port}`;
  }

  /** Starts a node and resolves once it accepts AMQP connections. */
  static async start(timeoutMs = 60_000): Promise<PrivateRabbitNode> {
    const dir = await mkdtemp(join(tmpdir(), 'mailroom-rabbit-'));
    const [port, distPort] = [await freePort(), await freePort()];
    const node = `mailroom-test-${process.pid}-${++started}@localhost`;
    const home = join(dir, 'home');
    await mkdir(home);
    await writeFile(join(home, '.erlang.cookie'), `MAILROOMTEST${process.pid}X${started}`, { mode: 0o400 });
    await writeFile(join(dir, 'rabbitmq.conf'), `listeners.tcp.local = 127.0.0.1:${port}\n`);
    await writeFile(join(dir, 'enabled_plugins'), '[].\n');
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      HOME: home,
      RABBITMQ_NODENAME: node,
      RABBITMQ_DIST_PORT: String(distPort),
      RABBITMQ_CONFIG_FILE: join(dir, 'rabbitmq.conf'),
      RABBITMQ_ENABLED_PLUGINS_FILE: join(dir, 'enabled_plugins'),
      RABBITMQ_MNESIA_BASE: join(dir, 'mnesia'),
      RABBITMQ_LOG_BASE: join(dir, 'log'),
      RABBITMQ_PID_FILE: join(dir, 'pid'),
      RABBITMQ_CONF_ENV_FILE: '/dev/null', // not /etc/rabbitmq/rabbitmq-env.conf, which names the shared node
    };
    const server = new PrivateRabbitNode(node, port, dir, env);
    server.child = spawn(join(RABBITMQ_BIN_DIR, 'rabbitmq-server'), [], { env, stdio: 'ignore' });
    server.child.on('error', () => {}); // a missing binary shows as the wait's timeout below, with the path in it
    try {
      await server.waitForConnections(timeoutMs);
    } catch (error) {
      await server.stop();
      throw error;
    }
    return server;
  }

  /** Runs `rabbitmqctl -n <node> ...args` against this node. */
  async ctl(...args: string[]): Promise<string> {
    const { stdout } = await run(join(RABBITMQ_BIN_DIR, 'rabbitmqctl'), ['-n', this.node, ...args], { env: this.env, timeout: 60_000 });
    return stdout;
  }

  /** `stop_app`: the node stays up, AMQP connections close and new ones are refused. */
  async stopApp(): Promise<void> {
    await this.ctl('stop_app');
  }

  /** `start_app`, then waits until an AMQP connection succeeds. */
  async startApp(): Promise<void> {
    await this.ctl('start_app');
    await this.waitForConnections(60_000);
  }

  /** Stops and starts the application; resolves once connections succeed again. */
  async restartApp(): Promise<void> {
    await this.stopApp();
    await this.startApp();
  }

  /** Resolves once an AMQP connection succeeds (polling every 100 ms). */
  async waitForConnections(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        const connection = await connect(this.url, { timeout: 2000 });
        connection.on('error', () => {});
        await connection.close().catch(() => {});
        return;
      } catch (error) {
        if (Date.now() > deadline) {
          throw new Error(`the private RabbitMQ node ${this.node} (${join(RABBITMQ_BIN_DIR, 'rabbitmq-server')}) did not accept connections on port ${this.port} within ${timeoutMs} ms`, { cause: error });
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  }

  /** Shuts the node down (killed if it does not stop in 30 s) and deletes its directory. Idempotent. */
  async stop(): Promise<void> {
    const child = this.child;
    this.child = null;
    if (child && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
      await this.ctl('shutdown').catch(() => child.kill('SIGTERM'));
      const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
      await exited;
      clearTimeout(timer);
    }
    await rm(this.dir, { recursive: true, force: true });
  }
}
