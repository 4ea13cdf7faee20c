/**
 * CPU seconds spent by each kind of process on the machine between two
 * samples, read from /proc (Linux only): PostgreSQL backends, Node, Redis,
 * nats-server and RabbitMQ's Erlang VM. For benches that ask where a run's
 * CPU went: who is the bottleneck when the machine has two cores.
 *
 *   const before = sampleCpu(); ...run...; console.log(formatCpuSplit(cpuSplit(before, sampleCpu()), seconds));
 */
import { readdirSync, readFileSync } from 'node:fs';

const KINDS = new Set(['postgres', 'node', 'redis-server', 'nats-server', 'beam.smp']);
/** Clock ticks per second of /proc/<pid>/stat's utime and stime (USER_HZ, 100 on Linux). */
const TICKS = 100;

/** pid → [process name, CPU ticks so far]. */
export type CpuSample = Map<number, [string, number]>;

export function sampleCpu(): CpuSample {
  const sample: CpuSample = new Map();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
    } catch {
      continue; // gone since the listing
    }
    const name = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'));
    if (!KINDS.has(name)) continue;
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    sample.set(Number(entry), [name, Number(fields[11]) + Number(fields[12])]);
  }
  return sample;
}

/** CPU seconds per process name between two samples (processes that started in between count from zero). */
export function cpuSplit(before: CpuSample, after: CpuSample): Record<string, number> {
  const split: Record<string, number> = {};
  for (const [pid, [name, ticks]] of after) {
    const spent = ticks - (before.get(pid)?.[1] ?? 0);
    if (spent > 0) split[name] = (split[name] ?? 0) + spent / TICKS;
  }
  return split;
}

/** "postgres 1.20 s (40 %), node 0.90 s (30 %)": each as CPU seconds and as a share of one core over `seconds`. */
export function formatCpuSplit(split: Record<string, number>, seconds: number): string {
  return Object.entries(split)
    .sort((a, b) => b[1] - a[1])
    .map(([name, cpu]) => `${name} ${cpu.toFixed(2)} s (${Math.round((cpu / seconds) * 100)} % of a core)`)
    .join(', ');
}
