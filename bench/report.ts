/**
 * The report for people: Markdown tables (readable as they are in a terminal),
 * each system's figure beside mailroom's as a ratio, and as a fraction of what
 * PostgreSQL itself did on the same server in the same run.
 */
import { ON_POSTGRES, SYSTEMS, type SystemId } from './adapters/index.ts';
import type { Outcome, Results } from './results.ts';
import type { ScaleResult } from './workloads/scale.ts';

function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) => `| ${cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join(' | ')} |`;
  const rule = `|${widths.map((w, i) => (i === 0 ? ` ${'-'.repeat(w)} ` : ` ${'-'.repeat(w - 1)}: `)).join('|')}|`;
  return [line(header), rule, ...rows.map(line)].join('\n');
}

const int = (n: number) => (Number.isFinite(n) ? Math.round(n).toLocaleString('en-US') : '—');
const ms = (n: number) => (Number.isFinite(n) ? (n < 10 ? n.toFixed(2) : n < 100 ? n.toFixed(1) : n.toFixed(0)) : '—');
const ratio = (a: number | undefined, b: number | undefined) => (a !== undefined && b !== undefined && b > 0 && Number.isFinite(a / b) ? `${(a / b).toFixed(2)}×` : '—');
const pct = (a: number | undefined, b: number | undefined) => (a !== undefined && b !== undefined && b > 0 ? `${((100 * a) / b).toFixed(0)}%` : '—');
const failure = (o: { ok: false; error: string }) => `failed: ${o.error.split('\n')[0]!.slice(0, 80)}`;

function value<T>(o: Outcome<T> | undefined): T | undefined {
  return o?.ok ? o.value : undefined;
}

function systemsIn<T>(map: Partial<Record<SystemId, Outcome<T>>>): SystemId[] {
  return SYSTEMS.filter((s) => map[s] !== undefined);
}

export function report(r: Results): string {
  const out: string[] = [];
  const ceiling = value(r.ceiling);
  const c = r.config;
  const m = r.machine;

  out.push(
    `Machine: ${m.cpus} CPUs (${m.cpuModel}), ${m.memoryGiB} GiB; load average ${m.loadAtStart.join(' ')} at start, ${m.loadAtEnd.join(' ')} at end. ` +
      `PostgreSQL ${m.postgres.version} (${Object.entries(m.postgres.settings)
        .map(([k, v]) => `${k}=${v}`)
        .join(', ')}). ` +
      ('error' in m.redis ? `Redis: ${m.redis.error}.` : `Redis ${m.redis.version} (appendonly=${m.redis.appendonly}, save=${m.redis.save}).`) +
      ` Node ${m.node}. Mode: ${c.mode}${c.big ? ' + big' : ''}; ${Math.round(r.seconds)} s.`,
  );
  out.push('');
  out.push('Ratios are mailroom ÷ system: above 1 mailroom is faster for throughput; below 1 mailroom is faster for latency.');

  const drainSystems = systemsIn(r.drain);
  if (drainSystems.length > 0) {
    const mine = value(r.drain.mailroom)?.jobsPerSecond;
    const rounds = c.rounds > 1 ? `; median of ${c.rounds} rounds` : '';
    out.push('', `### Drain: ${int(c.jobs)} no-op jobs enqueued in bulk, then drained at concurrency ${c.concurrency}${rounds}`, '');
    const header = ['system', 'jobs/s', 'rounds (min–max)', 'mailroom ÷', '÷ claim+delete ceiling', '÷ claim+keep ceiling', 'checks'];
    const withRounds = c.rounds > 1;
    const drop = (row: string[]) => (withRounds ? row : row.filter((_, i) => i !== 2));
    out.push(
      table(
        drop(header),
        drainSystems.map((s) => {
          const o = r.drain[s]!;
          if (!o.ok) return drop([s, failure(o), '', '', '', '', '']);
          const v = o.value;
          const pg = ON_POSTGRES[s];
          const checks = `${v.duplicates} dup, ${v.failed} failed`;
          const spread = v.rounds.length > 1 ? `${int(Math.min(...v.rounds))}–${int(Math.max(...v.rounds))}` : '';
          return drop([
            s,
            int(v.jobsPerSecond),
            spread,
            s === 'mailroom' ? '' : ratio(mine, v.jobsPerSecond),
            pg ? pct(v.jobsPerSecond, ceiling?.claimDeleteRowsPerSecond) : '(Redis)',
            pg ? pct(v.jobsPerSecond, ceiling?.claimKeepRowsPerSecond) : '(Redis)',
            checks,
          ]);
        }),
      ),
    );
  }

  const enqueueSystems = systemsIn(r.enqueue);
  if (enqueueSystems.length > 0) {
    const mine = value(r.enqueue.mailroom);
    const rounds = c.rounds > 1 ? `; median of ${c.rounds} rounds` : '';
    out.push('', `### Enqueue: ${int(c.single)} jobs one at a time (each awaited), ${int(c.bulk)} jobs in bulk calls of ${int(c.batch)}${rounds}`, '');
    out.push(
      table(
        ['system', 'single jobs/s', 'mailroom ÷', '÷ 1-client INSERT ceiling', 'bulk jobs/s', 'mailroom ÷', '÷ batched INSERT ceiling'],
        enqueueSystems.map((s) => {
          const o = r.enqueue[s]!;
          if (!o.ok) return [s, failure(o), '', '', '', '', ''];
          const v = o.value;
          const pg = ON_POSTGRES[s];
          return [
            s,
            int(v.single.jobsPerSecond),
            s === 'mailroom' ? '' : ratio(mine?.single.jobsPerSecond, v.single.jobsPerSecond),
            pg ? pct(v.single.jobsPerSecond, ceiling?.insertCommitsPerSecond1) : '(Redis)',
            int(v.bulk.jobsPerSecond),
            s === 'mailroom' ? '' : ratio(mine?.bulk.jobsPerSecond, v.bulk.jobsPerSecond),
            pg ? pct(v.bulk.jobsPerSecond, ceiling?.batchInsertRowsPerSecond) : '(Redis)',
          ];
        }),
      ),
    );
  }

  const latencySystems = systemsIn(r.latency);
  if (latencySystems.length > 0) {
    const mine = value(r.latency.mailroom);
    out.push('', `### Latency: idle workers, ${int(c.latencyJobs)} jobs enqueued one at a time at ${c.rate}/s; enqueue call to handler start, ms`, '');
    out.push(
      table(
        ['system', 'p50', 'p90', 'p99', 'max', 'mailroom ÷ p50', 'mailroom ÷ p99', 'missing'],
        latencySystems.map((s) => {
          const o = r.latency[s]!;
          if (!o.ok) return [s, failure(o), '', '', '', '', '', ''];
          const v = o.value;
          return [
            s,
            ms(v.p50Ms),
            ms(v.p90Ms),
            ms(v.p99Ms),
            ms(v.maxMs),
            s === 'mailroom' ? '' : ratio(mine?.p50Ms, v.p50Ms),
            s === 'mailroom' ? '' : ratio(mine?.p99Ms, v.p99Ms),
            String(v.missing),
          ];
        }),
      ),
    );
  }

  if (r.scale.processes.length > 0 || r.scale.backlogs.length > 0 || r.scale.ordered) {
    out.push('', `### Scale (mailroom): worker processes of concurrency ${c.concurrency} each, and backlogs drained by one process`, '');
    const rows: string[][] = [];
    const base = value(r.scale.processes[0]);
    for (const o of r.scale.processes) {
      if (!o.ok) rows.push(['processes', failure(o), '', '', '', '', '']);
      else {
        const v = o.value;
        rows.push([`${v.processes} process${v.processes > 1 ? 'es' : ''}, ${int(v.jobs)} jobs`, int(v.jobsPerSecond), int(v.steadyJobsPerSecond), ms(v.microsPerJob), ratio(v.jobsPerSecond, base?.jobsPerSecond), pct(v.jobsPerSecond, ceiling?.claimKeepRowsPerSecond), `${int(v.completedInDatabase)} completed`]);
      }
    }
    const o = r.scale.ordered;
    if (o && !o.ok) rows.push(['ordered', failure(o), '', '', '', '', '']);
    else if (o?.ok) {
      const v = o.value;
      rows.push([`1 process, ${int(v.jobs)} jobs over ${v.orderingKeys} ordering keys`, int(v.jobsPerSecond), int(v.steadyJobsPerSecond), ms(v.microsPerJob), ratio(v.jobsPerSecond, base?.jobsPerSecond), pct(v.jobsPerSecond, ceiling?.claimKeepRowsPerSecond), `${int(v.completedInDatabase)} completed`]);
    }
    const first = value(r.scale.backlogs[0]);
    for (const o of r.scale.backlogs) {
      if (!o.ok) rows.push(['backlog', failure(o), '', '', '', '', '']);
      else {
        const v = o.value;
        const rounds = v.rounds && v.rounds.length > 1 ? `; steady of each round ${v.rounds.map(int).join(' / ')}` : '';
        rows.push([`backlog ${int(v.jobs)}, 1 process`, int(v.jobsPerSecond), int(v.steadyJobsPerSecond), ms(v.microsPerJob), ratio(v.steadyJobsPerSecond, first?.steadyJobsPerSecond), pct(v.jobsPerSecond, ceiling?.claimKeepRowsPerSecond), `${int(v.completedInDatabase)} completed${rounds}`]);
      }
    }
    out.push(table(['run', 'jobs/s (whole drain)', 'steady jobs/s', 'µs/job (steady)', 'vs first row of its kind', '÷ claim+keep ceiling', 'check'], rows));
    const label = (kind: string) => (o: Outcome<ScaleResult>) => (o.ok ? [{ v: o.value, kind }] : []);
    const byTenth = [
      ...r.scale.processes.flatMap(label('processes')),
      ...(r.scale.ordered ? label('ordered')(r.scale.ordered) : []),
      ...r.scale.backlogs.flatMap(label('backlog')),
    ];
    if (byTenth.length > 0) {
      out.push('', 'Drain rate by tenth of the jobs, thousands of jobs/s (first tenth includes start-up):', '');
      out.push(
        table(
          ['run', ...Array.from({ length: 10 }, (_, k) => `${k + 1}`)],
          byTenth.map(({ v, kind }) => [
            kind === 'backlog'
              ? `backlog ${int(v.jobs)}`
              : kind === 'ordered'
                ? `${int(v.jobs)} jobs, ${v.orderingKeys} keys`
                : `${int(v.jobs)} jobs, ${v.processes} process${v.processes > 1 ? 'es' : ''}`,
            ...v.tenths.map((x) => (x / 1000).toFixed(1)),
          ]),
        ),
      );
    }
    out.push(
      '',
      `Steady: completions 1,000 to 1,000 + min(10,000, backlog/2), while the backlog is still near its size, each end moved to the end of its completion batch (the rate counts the completions between those two instants); each backlog is drained in ${c.rounds} round(s), the backlogs taking turns within each round, the round with the median steady rate shown (its whole drain and tenths too). Each process first drains ${int(c.scaleWarmUp)} jobs of a queue of its own, before the clock starts. "vs first row": processes and ordered against 1 process (whole drain), backlogs against the smallest backlog (steady rate).`,
    );
  }

  if (r.ceiling) {
    out.push('', '### PostgreSQL ceiling (same server, same run)', '');
    if (!r.ceiling.ok) out.push(failure(r.ceiling));
    else {
      const v = r.ceiling.value;
      out.push(
        table(
          ['measure', 'per second'],
          [
            ['single-row INSERT commits, 1 client (pgbench)', int(v.insertCommitsPerSecond1)],
            [`single-row INSERT commits, ${v.clientsN} clients (pgbench)`, int(v.insertCommitsPerSecondN)],
            [`rows of a ${int(v.insertBatch)}-row INSERT, 1 client (pgbench)`, int(v.batchInsertRowsPerSecond)],
            [`SKIP LOCKED claim-and-delete, batch ${v.claimBatch}, ${v.loops} connections (rows)`, int(v.claimDeleteRowsPerSecond)],
            [`SKIP LOCKED claim + complete keeping rows, batch ${v.claimBatch}, ${v.loops} connections (rows)`, int(v.claimKeepRowsPerSecond)],
          ],
        ),
      );
    }
  }

  const configured = SYSTEMS.filter((s) => r.configurations[s] !== undefined);
  if (configured.length > 0) {
    out.push('', '### Configurations', '');
    for (const s of configured) out.push(`- ${s} ${r.machine.versions[s === 'bullmq-redis' || s === 'bullmq-postgres' ? 'bullmq' : s] ?? ''}: ${r.configurations[s]}`);
  }
  if (r.notes.length > 0) out.push('', ...r.notes.map((n) => `Note: ${n}`));
  return out.join('\n');
}
