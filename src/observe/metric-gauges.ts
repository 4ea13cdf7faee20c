/**
 * The metrics read from the database at scrape time (`mailroom.stats()`, one
 * call per scrape shared by every gauge): depth by state, oldest age, dead
 * letters, relay and consumer lag, the scaling signal. They count every
 * process's work, so every process reports the same numbers.
 */
import { Counter, Gauge, type Registry } from 'prom-client';
import type { MailroomStats, QueueStats } from '../stats.ts';
import { desiredWorkers, type ResolvedDesiredWorkersOptions } from './desired-workers.ts';
import type { MetricsSource } from './metrics.ts';

/** The job states of `mailroom_jobs{state}`. */
export const JOB_STATES = ['available', 'scheduled', 'retrying', 'blocked', 'active', 'dead'] as const;

const CLUSTER = '(from the database: every process reports the same; aggregate with max, not sum)';

/** Settings of {@link registerStatsMetrics}. */
export interface StatsMetricsSettings {
  prefix: string;
  /** Queue names met in events or earlier scrapes: an emptied queue reports 0 rather than vanishing. */
  seen: Set<string>;
  scaling: ResolvedDesiredWorkersOptions;
  /** How long one `stats()` result serves scrapes, in ms. */
  statsTtlMs: number;
}

/** Registers the database-fed gauges on `registry`. */
export function registerStatsMetrics(source: MetricsSource, registry: Registry, settings: StatsMetricsSettings): void {
  const { prefix, seen, scaling, statsTtlMs } = settings;
  let cached: { at: number; stats: Promise<MailroomStats> } | undefined;
  // One stats() per scrape: the first gauge's collect starts it, the others (and scrapes within the TTL) share it.
  const snapshot = (): Promise<MailroomStats> => {
    const now = Date.now();
    if (!cached || now - cached.at > statsTtlMs) cached = { at: now, stats: source.stats() };
    return cached.stats;
  };
  const queues = async () => {
    const stats = await snapshot();
    for (const q of Object.keys(stats.queues)) seen.add(q);
    return [...seen].sort().map((queue) => ({ queue, owner: source.ownerOf(queue) ?? '', stats: stats.queues[queue] }));
  };
  const registers = [registry];

  new Gauge({
    name: `${prefix}mailroom_jobs`,
    help: `Jobs by queue and state ${CLUSTER}`,
    labelNames: ['queue', 'owner', 'state'],
    registers,
    async collect() {
      const rows = await queues();
      this.reset();
      for (const { queue, owner, stats } of rows) for (const state of JOB_STATES) this.set({ queue, owner, state }, stats?.[state] ?? 0);
    },
  });
  const perQueue = (name: string, help: string, value: (stats: QueueStats) => number) =>
    new Gauge({
      name: prefix + name,
      help: `${help} ${CLUSTER}`,
      labelNames: ['queue', 'owner'],
      registers,
      async collect() {
        const rows = await queues();
        this.reset();
        for (const { queue, owner, stats } of rows) this.set({ queue, owner }, stats ? value(stats) : 0);
      },
    });
  perQueue('mailroom_oldest_job_age_seconds', 'Seconds the oldest available job has been due (0 when none waits)', (s) => s.oldestAgeSeconds);
  perQueue('mailroom_dead_letters', 'Jobs in the dead-letter queue', (s) => s.dead);
  perQueue(
    'mailroom_desired_workers',
    `Worker processes the queue needs (drain target ${scaling.drainTargetSeconds} s, ${scaling.workerConcurrency} jobs per worker; docs/OPERATIONS.md)`,
    (s) => desiredWorkers(s, scaling),
  );

  const perTarget = (name: string, help: string, value: (t: MailroomStats['relay'][string]) => number) =>
    new Gauge({
      name: prefix + name,
      help: `${help} ${CLUSTER}`,
      labelNames: ['target'],
      registers,
      async collect() {
        const { relay } = await snapshot();
        this.reset();
        for (const [target, t] of Object.entries(relay)) this.set({ target }, value(t));
      },
    });
  perTarget('mailroom_relay_unpublished', 'Committed outbox events the target has not received yet', (t) => t.unpublished);
  perTarget('mailroom_relay_lag_seconds', 'Age of the oldest event the target has not received, in seconds', (t) => t.lagSeconds);
  perTarget('mailroom_relay_held_back', '1 when an open transaction keeps committed events from the target', (t) => (t.heldBackBy ? 1 : 0));
  perTarget('mailroom_relay_parked', 'Events the target refused for good, parked in relay_parked', (t) => t.parked);

  new Gauge({
    name: `${prefix}mailroom_consumer_lag`,
    help: `Events the consumer group has not handled yet (not yet fanned out + waiting, retrying or running) ${CLUSTER}`,
    labelNames: ['group'],
    registers,
    async collect() {
      const { consumers } = await snapshot();
      this.reset();
      for (const [group, g] of Object.entries(consumers)) this.set({ group }, g.lag);
    },
  });
  new Gauge({
    name: `${prefix}mailroom_table_rows`,
    help: `Row versions of mailroom's busiest tables by kind (live, dead: not yet vacuumed), from PostgreSQL's statistics; many more dead than live is bloat ${CLUSTER}`,
    labelNames: ['table', 'kind'],
    registers,
    async collect() {
      const { tables } = await snapshot();
      this.reset();
      for (const [table, t] of Object.entries(tables)) {
        this.set({ table, kind: 'live' }, t.liveRows);
        this.set({ table, kind: 'dead' }, t.deadRows);
      }
    },
  });
  new Counter({
    name: `${prefix}mailroom_consumer_duplicates_rejected_total`,
    help: `Redeliveries the group's inbox acknowledged without running the handler, cluster-wide since the group was made ${CLUSTER}`,
    labelNames: ['group'],
    registers,
    async collect() {
      const { consumers } = await snapshot();
      this.reset();
      for (const [group, g] of Object.entries(consumers)) this.inc({ group }, g.duplicatesRejected);
    },
  });
}
