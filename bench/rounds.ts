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

export function summarizeDrain(outcomes: ReadonlyArray<Outcome<DrainResult>>): Outcome<DrainSummary> {
  const all = allOk(outcomes);
  if (!all.ok) return all;
  const median = medianBy(all.values, (v) => v.jobsPerSecond);
  return {
    ok: true,
    value: {
      ...median,
      duplicates: all.values.reduce((a, v) => a + v.duplicates, 0),
      failed: all.values.reduce((a, v) => a + v.failed, 0),
      rounds: all.values.map((v) => v.jobsPerSecond),
    },
  };
}

export function summarizeEnqueue(outcomes: ReadonlyArray<Outcome<EnqueueResult>>): Outcome<EnqueueSummary> {
  const all = allOk(outcomes);
  if (!all.ok) return all;
  return {
    ok: true,
    value: {
      single: medianBy(all.values, (v) => v.single.jobsPerSecond).single,
      bulk: medianBy(all.values, (v) => v.bulk.jobsPerSecond).bulk,
      rounds: { single: all.values.map((v) => v.single.jobsPerSecond), bulk: all.values.map((v) => v.bulk.jobsPerSecond) },
    },
  };
}

/** The round with the median steady rate, with every round's steady rate; completions checked in every round. */
export function summarizeScale(outcomes: ReadonlyArray<Outcome<ScaleResult>>): Outcome<ScaleResult> {
  const all = allOk(outcomes);
  if (!all.ok) return all;
  const median = medianBy(all.values, (v) => v.steadyJobsPerSecond);
  return {
    ok: true,
    value: {
      ...median,
      completedInDatabase: Math.min(...all.values.map((v) => v.completedInDatabase)),
      rounds: all.values.map((v) => v.steadyJobsPerSecond),
    },
  };
}
