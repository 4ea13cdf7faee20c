/**
 * Demo workers as child processes, for a PostgreSQL server. A crash is
 * SIGKILL: the process dies mid-job without a chance to clean up.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { quoteSchema } from '../identifiers.ts';
import type { CrashRecord, Fleet, FleetSettings } from './fleet.ts';
import type { Query } from './tables.ts';
import type { FromWorker, WorkerProcessConfig } from './worker-process.ts';

const READY_TIMEOUT_MS = 30_000;
const STOP_TIMEOUT_MS = 10_000;

interface Child {
  id: string;
  process: ChildProcess;
  ready: Promise<void>;
  exited: Promise<void>;
}

/**
 * How to start a worker process: from source (this file ends in .ts) with
 * node and the tsx loader, from the build (dist/) with plain node.
 */
function workerCommand(): string[] {
  const fromSource = import.meta.url.endsWith('.ts');
  const script = fileURLToPath(new URL(fromSource ? './worker-process.ts' : './worker-process.js', import.meta.url));
  return fromSource ? ['--import', import.meta.resolve('tsx'), script] : [script];
}

/** Worker processes on a PostgreSQL server; crashes are SIGKILLs. */
export class ProcessFleet implements Fleet {
  readonly crashKind = 'sigkill' as const;
  private readonly children = new Map<string, Child>();
  private started = 0;

  constructor(
    private readonly url: string,
    private readonly query: Query,
    private readonly settings: FleetSettings,
  ) {}

  async start(): Promise<void> {
    const children = Array.from({ length: this.settings.workers }, () => this.spawnWorker());
    await Promise.all(children.map((c) => c.ready));
  }

  alive(): number {
    return this.children.size;
  }

  async crashOne(elapsedMs: number): Promise<CrashRecord | undefined> {
    const held = await this.heldJobs();
    const victim = [...this.children.values()]
      .map((child) => ({ child, held: held.get(child.id) ?? 0 }))
      .sort((a, b) => b.held - a.held)[0];
    if (!victim || victim.held === 0) return undefined;
    const { child } = victim;
    this.children.delete(child.id);
    child.process.kill('SIGKILL');
    await child.exited;
    const inFlight = (await this.heldJobs()).get(child.id) ?? 0;
    const replacement = this.spawnWorker();
    const record: CrashRecord = { worker: child.id, inFlight, atMs: elapsedMs, replacement: replacement.id };
    if (child.process.pid !== undefined) record.pid = child.process.pid;
    return record;
  }

  async stop(): Promise<void> {
    const children = [...this.children.values()];
    this.children.clear();
    await Promise.all(
      children.map(async (child) => {
        await child.ready.catch(() => {});
        if (child.process.connected) child.process.send({ type: 'stop' });
        const timer = setTimeout(() => child.process.kill('SIGKILL'), STOP_TIMEOUT_MS);
        await child.exited;
        clearTimeout(timer);
      }),
    );
  }

  kill(): void {
    for (const child of this.children.values()) child.process.kill('SIGKILL');
    this.children.clear();
  }

  /** Jobs each worker holds now (active and locked by it). */
  private async heldJobs(): Promise<Map<string, number>> {
    const rows = await this.query<{ locked_by: string; n: number }>(
      `SELECT locked_by, count(*)::int AS n FROM ${quoteSchema(this.settings.schema)}.jobs WHERE state = 'active' GROUP BY locked_by`,
    );
    return new Map(rows.map((r) => [r.locked_by, r.n]));
  }

  private spawnWorker(): Child {
    const id = `w${++this.started}`;
    const { schema, concurrency, leaseMs, pollMs, rescueMs } = this.settings;
    const config: WorkerProcessConfig = { url: this.url, schema, id, concurrency, leaseMs, pollMs, rescueMs };
    // The child's stdout goes to our stderr: our stdout carries only the ledger (or its JSON).
    const proc = spawn(process.execPath, workerCommand(), {
      env: { ...process.env, MAILROOM_DEMO_WORKER: JSON.stringify(config) },
      stdio: ['ignore', 2, 2, 'ipc'],
    });
    const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
    const ready = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`demo worker process ${id} did not start within ${READY_TIMEOUT_MS / 1000}s`)), READY_TIMEOUT_MS);
      proc.on('message', (message: FromWorker) => {
        if (message?.type === 'ready') {
          clearTimeout(timer);
          resolve();
        }
      });
      proc.once('exit', (code, signal) => {
        clearTimeout(timer);
        reject(new Error(`demo worker process ${id} exited before it was ready (${signal ?? `exit code ${code}`}); see its messages above`));
      });
      proc.once('error', (error) => {
        clearTimeout(timer);
        reject(new Error(`cannot start demo worker process ${id}: ${error.message}`));
      });
    });
    ready.catch(() => {}); // awaited by start(), crashOne() or stop(); never an unhandled rejection
    const child: Child = { id, process: proc, ready, exited };
    this.children.set(id, child);
    return child;
  }
}
