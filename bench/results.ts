/** The shape of one benchmark run's results (what `--json` prints). */
import type { SystemId } from './adapters/index.ts';
import type { BenchConfig } from './config.ts';
import type { MachineInfo } from './machine.ts';
import type { CeilingResult } from './workloads/ceiling.ts';
import type { DrainSummary, EnqueueSummary } from './rounds.ts';
import type { LatencyResult } from './workloads/latency.ts';
import type { ScaleResult } from './workloads/scale.ts';

/** A measurement, or why there is none. */
export type Outcome<T> = { ok: true; value: T } | { ok: false; error: string };

export interface Results {
  startedAt: string;
  seconds: number;
  config: Omit<BenchConfig, 'json' | 'out'>;
  machine: MachineInfo;
  /** How each system was configured. */
  configurations: Partial<Record<SystemId, string>>;
  /** Each system's median round, with every round's jobs/s. */
  drain: Partial<Record<SystemId, Outcome<DrainSummary>>>;
  enqueue: Partial<Record<SystemId, Outcome<EnqueueSummary>>>;
  latency: Partial<Record<SystemId, Outcome<LatencyResult>>>;
  scale: { processes: Array<Outcome<ScaleResult>>; ordered: Outcome<ScaleResult> | undefined; backlogs: Array<Outcome<ScaleResult>> };
  ceiling: Outcome<CeilingResult> | undefined;
  notes: string[];
}
