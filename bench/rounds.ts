/**
 * Drain and enqueue run in several interleaved rounds (every system once per
 * round), and the report takes each system's median round: on a shared,
 * noisy machine one unlucky second then moves no comparison. The scale
 * workload's backlogs run several rounds each too (their steady rate over a
 * few completion batches is the noisiest figure), reported by the median.
 */
import type { Outcome } from './results.ts';
import type { DrainResult } from './workloads/drain.ts';
import type { EnqueueResult } from './workloads/enqueue.ts';
import type { ScaleResult } from './workloads/scale.ts';

export type DrainSummary = DrainResult & { rounds: number[] };
export type EnqueueSummary = EnqueueResult & { rounds: { single: number[]; bulk: number[] } };

/** The element whose key is the median (the lower middle one for an even count). */
function medianBy<T>(items: readonly T[], key: (t: T) => number): T {
  const sorted = [...items].sort((a, b) => key(a) - key(b));
  return sorted[Math.floor((sorted.length - 1) / 2)]!;
}

function allOk<T>(outcomes: ReadonlyArray<Outcome<T>>): { ok: true; values: T[] } | { ok: false; error: string } {
  const failed = outcomes.find((o): o is { ok: false; error: string } => !o.ok);
  if (failed) return { ok: false, error: `${outcomes.filter((o) => !o.ok).length} of ${outcomes.length} rounds failed; first: ${failed.error}` };
  return { ok: true, values: outcomes.map((o) => (o as { ok: true; value: T }).value) };
}

/** Every round must have succeeded; then `merge` makes one result of their values. */
function summarize<T, S>(outcomes: ReadonlyArray<Outcome<T>>, merge: (values: T[]) => S): Outcome<S> {
  const all = allOk(outcomes);
  return all.ok ? { ok: true, value: merge(all.values) } : all;
}

/** The round with the median rate, with every round's rate; duplicates and failures of all rounds added up. */
export function summarizeDrain(outcomes: ReadonlyArray<Outcome<DrainResult>>): Outcome<DrainSummary> {
  return summarize(outcomes, (values) => ({
    ...medianBy(values, (v) => v.jobsPerSecond),
    duplicates: values.reduce((a, v) => a + v.duplicates, 0),
    failed: values.reduce((a, v) => a + v.failed, 0),
    rounds: values.map((v) => v.jobsPerSecond),
  }));
}

/** The median single and bulk rates (each from its own median round), with every round's. */
export function summarizeEnqueue(outcomes: ReadonlyArray<Outcome<EnqueueResult>>): Outcome<EnqueueSummary> {
  return summarize(outcomes, (values) => ({
    single: medianBy(values, (v) => v.single.jobsPerSecond).single,
    bulk: medianBy(values, (v) => v.bulk.jobsPerSecond).bulk,
    rounds: { single: values.map((v) => v.single.jobsPerSecond), bulk: values.map((v) => v.bulk.jobsPerSecond) },
  }));
}

/** The round with the median steady rate, with every round's steady rate; completions checked in every round. */
export function summarizeScale(outcomes: ReadonlyArray<Outcome<ScaleResult>>): Outcome<ScaleResult> {
  return summarize(outcomes, (values) => ({
    ...medianBy(values, (v) => v.steadyJobsPerSecond),
    completedInDatabase: Math.min(...values.map((v) => v.completedInDatabase)),
    rounds: values.map((v) => v.steadyJobsPerSecond),
  }));
}
