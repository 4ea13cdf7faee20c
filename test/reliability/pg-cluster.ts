/**
 * A private PostgreSQL cluster for the faults that restart the server: the
 * machine's shared server (port 5432) serves other test files at the same
 * time and is never restarted. `initdb` + `pg_ctl` from
 * `/usr/lib/postgresql/<version>/bin`, on a free loopback port, in a temp
 * directory removed by `stop()`; trust auth on 127.0.0.1 only, `fsync=on`,
 * `synchronous_commit=on`. PostgreSQL refuses to run as root, so when the
 * tests run as root the server runs as the `postgres` OS user (`runuser`).
 */
import { execFile } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { chmod, chown, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { freePort } from '../helpers/brokers/free-port.ts';

const run = promisify(execFile);
const POSTGRES_LIB = '/usr/lib/postgresql';

/** The newest `/usr/lib/postgresql/<version>/bin` that has initdb and pg_ctl, or null. */
export function findPostgresBin(): string | null {
  if (!existsSync(POSTGRES_LIB)) return null;
  const versions = readdirSync(POSTGRES_LIB)
    .filter((v) => existsSync(join(POSTGRES_LIB, v, 'bin', 'initdb')) && existsSync(join(POSTGRES_LIB, v, 'bin', 'pg_ctl')))
    .sort((a, b) => Number(b) - Number(a));
  return versions[0] === undefined ? null : join(POSTGRES_LIB, versions[0], 'bin');
}

/** Why a private cluster cannot start here, or null when it can. */
export function privateClusterUnavailable(): string | null {
  if (findPostgresBin() === null) return `no initdb/pg_ctl under ${POSTGRES_LIB}/<version>/bin (install the PostgreSQL server package)`;
  // PostgreSQL refuses to run as root: the server then runs as the postgres OS user, through runuser.
  if (process.getuid?.() === 0 && !['/usr/sbin/runuser', '/sbin/runuser', '/usr/bin/runuser'].some((p) => existsSync(p))) {
    return 'the tests run as root and runuser is missing (PostgreSQL refuses to run as root)';
  }
  return null;
}

export class PgCluster {
  private running = true;

  private constructor(
    private readonly bin: string,
    /** The cluster's data directory and sockets live here; removed by `stop()`. */
    readonly dir: string,
    readonly port: number,
    private readonly asPostgres: boolean,
  ) {}

  /** `postgres://postgres@127.0.0.1:<port>/postgres`, optionally with an `application_name`. */
  url(applicationName?: string): string {
    const url = new URL(`postgres://postgres@127.0.0.1:${this.port}/postgres`);
    if (applicationName) url.searchParams.set('application_name', applicationName);
    return url.toString();
  }

  /**
   * Creates and starts a cluster in a temp directory on a free port (a few seconds).
   *
   * @example
   * const cluster = await PgCluster.start();
   * try { await cluster.restart({ mode: 'immediate' }); } finally { await cluster.stop(); }
   */
  static async start(): Promise<PgCluster> {
    const why = privateClusterUnavailable();
    if (why) throw new Error(`cannot start a private PostgreSQL cluster: ${why}`);
    const bin = findPostgresBin()!;
    const asPostgres = process.getuid?.() === 0;
    const dir = await mkdtemp(join(tmpdir(), 'mailroom-pg-'));
    const port = await freePort();
    const cluster = new PgCluster(bin, dir, port, asPostgres);
    try {
      if (asPostgres) {
        const { stdout } = await run('id', ['-u', 'postgres']);
        const { stdout: gid } = await run('id', ['-g', 'postgres']);
        await chown(dir, Number(stdout.trim()), Number(gid.trim()));
      }
      await chmod(dir, 0o700);
      await cluster.pg('initdb', ['-D', cluster.data, '-U', 'postgres', '--auth=trust', '--no-sync', '-E', 'UTF8', '--locale=C']);
      const conf = [
        `port = ${port}`,
        "listen_addresses = '127.0.0.1'",
        `unix_socket_directories = '${dir}'`,
        'fsync = on',
        'synchronous_commit = on',
        'full_page_writes = on',
        'max_connections = 200',
        'shared_buffers = 32MB',
        'log_min_messages = fatal',
        'logging_collector = off',
      ].join('\n');
      await writeFile(join(cluster.data, 'postgresql.auto.conf'), `${conf}\n`);
      await writeFile(join(cluster.data, 'pg_hba.conf'), 'local all all trust\nhost all all 127.0.0.1/32 trust\n');
      await cluster.ctl(['start', '-w', '-t', '30', '-l', join(dir, 'server.log')]);
      return cluster;
    } catch (error) {
      await cluster.stop().catch(() => {});
      throw error;
    }
  }

  private get data(): string {
    return join(this.dir, 'data');
  }

  private async pg(tool: string, args: string[]): Promise<string> {
    const path = join(this.bin, tool);
    const { stdout } = this.asPostgres ? await run('runuser', ['-u', 'postgres', '--', path, ...args], { timeout: 60_000 }) : await run(path, args, { timeout: 60_000 });
    return stdout;
  }

  private async ctl(args: string[]): Promise<void> {
    await this.pg('pg_ctl', ['-D', this.data, ...args]);
  }

  /**
   * Restarts the server. `immediate`: every backend is killed at once, no
   * checkpoint (crash recovery on start), as after a power cut; `fast`: clean.
   * Resolves when it accepts connections again.
   */
  async restart(options: { mode: 'immediate' | 'fast' } = { mode: 'immediate' }): Promise<{ stopMs: number; startMs: number }> {
    const t0 = Date.now();
    await this.ctl(['stop', '-m', options.mode, '-w', '-t', '30']);
    const t1 = Date.now();
    await this.ctl(['start', '-w', '-t', '30', '-l', join(this.dir, 'server.log')]);
    return { stopMs: t1 - t0, startMs: Date.now() - t1 };
  }

  /**
   * `pg_terminate_backend` on every session whose `application_name` matches
   * the LIKE pattern (e.g. `rel1234-%`); resolves with how many were terminated.
   *
   * @example
   * await cluster.terminateBackends('myapp-%');
   */
  async terminateBackends(applicationNameLike: string): Promise<number> {
    const client = new pg.Client({ connectionString: this.url('pg-cluster-admin') });
    client.on('error', () => {});
    await client.connect();
    try {
      const { rows } = await client.query<{ n: number }>(
        `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))::int AS n FROM pg_stat_activity
          WHERE application_name LIKE $1 AND pid <> pg_backend_pid()`,
        [applicationNameLike],
      );
      return rows[0]?.n ?? 0;
    } finally {
      await client.end().catch(() => {});
    }
  }

  /** Stops the server (immediately) and removes its directory. Safe to call twice. */
  async stop(): Promise<void> {
    if (this.running) {
      this.running = false;
      if (existsSync(join(this.data, 'postmaster.pid'))) await this.ctl(['stop', '-m', 'immediate', '-w', '-t', '30']).catch(() => {});
    }
    await rm(this.dir, { recursive: true, force: true });
  }
}
