/**
 * Demo workers in the demo's own process, for the embedded database (PGlite
 * serves one process). A crash is `worker.abandon()`: the worker stops dead,
 * like a killed process, and only lease expiry plus maintenance recover its jobs.
 */
import { quoteSchema } from '../identifiers.ts';
import type { Mailroom } from '../mailroom.ts';
import type { JobHandler } from '../worker/types.ts';
import type { Worker } from '../worker/worker.ts';
import type { CrashRecord, Fleet, FleetSettings } from './fleet.ts';
import type { Query } from './tables.ts';
import { DEMO_QUEUE } from './workload.ts';

/** Workers sharing the demo's mailroom instance; crashes are in-process abandons. */
export class InProcessFleet implements Fleet {
  readonly crashKind = 'abandon' as const;
  private readonly workers: Worker[] = [];
  private started = 0;

  constructor(
    private readonly mailroom: Mailroom,
    private readonly query: Query,
    private readonly handlers: Record<string, JobHandler<never>>,
    private readonly settings: FleetSettings,
    private readonly onError: (error: unknown) => void,
  ) {}

  async start(): Promise<void> {
    for (let i = 0; i < this.settings.workers; i++) await this.startWorker();
  }

  alive(): number {
    return this.workers.length;
  }

  async crashOne(elapsedMs: number): Promise<CrashRecord | undefined> {
    const victim = [...this.workers].sort((a, b) => b.activeCount - a.activeCount)[0];
    if (!victim || victim.activeCount === 0) return undefined;
    victim.abandon();
    this.workers.splice(this.workers.indexOf(victim), 1);
    const rows = await this.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM ${quoteSchema(this.settings.schema)}.jobs WHERE state = 'active' AND locked_by = $1`,
      [victim.id],
    );
    const replacement = await this.startWorker();
    return { worker: victim.id, inFlight: rows[0]?.n ?? 0, atMs: elapsedMs, replacement: replacement.id };
  }

  async stop(): Promise<void> {
    await Promise.all(this.workers.splice(0).map((w) => w.stop({ timeout: '5s' })));
  }

  kill(): void {
    for (const w of this.workers.splice(0)) w.abandon();
  }

  private async startWorker(): Promise<Worker> {
    const { concurrency, leaseMs, pollMs } = this.settings;
    const worker = this.mailroom.worker({
      id: `w${++this.started}`,
      queues: [DEMO_QUEUE],
      concurrency,
      lease: leaseMs,
      pollInterval: pollMs,
      handlers: this.handlers,
    });
    worker.on('error', this.onError);
    await worker.start();
    this.workers.push(worker);
    return worker;
  }
}
