/**
 * The metrics this process counts from its own lifecycle events
 * (`mailroom.on(...)`): jobs enqueued, started, finished; durations; relay
 * batches; duplicates its consumers acknowledged.
 */
import { Counter, Histogram, type Registry } from 'prom-client';
import type { MetricsSource } from './metrics.ts';

/** Handler durations from 1 ms to 5 min, in seconds. */
export const DURATION_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

const JOB_LABELS = ['queue', 'owner', 'type'] as const;

/**
 * Registers the event-fed counters and the duration histogram on `registry`
 * and subscribes them to `source`'s events. `seen` collects the queue names
 * met, so the depth gauges can report 0 for a queue that emptied.
 */
export function registerEventMetrics(source: MetricsSource, registry: Registry, prefix: string, seen: Set<string>): void {
  const registers = [registry];
  const counter = <L extends string>(name: string, help: string, labelNames: readonly L[]) =>
    new Counter<L>({ name: prefix + name, help, labelNames, registers });
  const jobs = (name: string, help: string) => counter(name, `${help} (this process)`, JOB_LABELS);

  const enqueued = jobs('mailroom_jobs_enqueued_total', 'Jobs enqueued by enqueue/enqueueMany: one per id returned, an existing job a key matched included (in a transaction: counted when the insert ran)');
  const started = jobs('mailroom_jobs_started_total', 'Handler runs started by workers');
  const completed = jobs('mailroom_jobs_completed_total', 'Jobs completed');
  const failed = counter('mailroom_jobs_failed_total', 'Failed attempts; will_retry="false" went to the dead-letter queue (this process)', [...JOB_LABELS, 'will_retry']);
  const retried = jobs('mailroom_jobs_retried_total', 'Jobs scheduled for another attempt: a failed attempt that will retry, or a rescued lease');
  const deadLettered = jobs('mailroom_jobs_dead_lettered_total', "Jobs sent to the dead-letter queue (by a handler's failure or by lease expiry)");
  const rescued = jobs('mailroom_jobs_rescued_total', 'Jobs whose lease expired and were taken back by maintenance');
  const rateLimited = jobs('mailroom_jobs_rate_limited_total', 'Handlers that threw RateLimitedError (the queue backed off)');
  const duration = new Histogram<'queue' | 'owner' | 'type' | 'outcome'>({
    name: `${prefix}mailroom_job_duration_seconds`,
    help: 'Handler run time in seconds by outcome: completed, failed (will retry), dead (dead-lettered) (this process)',
    labelNames: [...JOB_LABELS, 'outcome'],
    buckets: DURATION_BUCKETS,
    registers,
  });
  const published = counter('mailroom_relay_published_total', 'Events a relay in this process delivered to the target', ['target']);
  const duplicates = counter(
    'mailroom_consumer_duplicates_seen_total',
    "Redeliveries this process's consumers acknowledged without running the handler (cluster-wide: mailroom_consumer_duplicates_rejected_total)",
    ['group'],
  );

  const labels = (job: { queue: string; type: string }) => {
    seen.add(job.queue);
    return { queue: job.queue, owner: source.ownerOf(job.queue) ?? '', type: job.type };
  };
  source.on('job.enqueued', (info) => enqueued.inc(labels(info), info.ids.length));
  source.on('job.started', (job) => started.inc(labels(job)));
  source.on('job.completed', (job) => {
    const l = labels(job);
    completed.inc(l);
    duration.observe({ ...l, outcome: 'completed' }, job.durationMs / 1000);
  });
  source.on('job.failed', (job) => {
    const l = labels(job);
    failed.inc({ ...l, will_retry: String(job.willRetry) });
    if (job.willRetry) retried.inc(l);
    duration.observe({ ...l, outcome: job.willRetry ? 'failed' : 'dead' }, job.durationMs / 1000);
  });
  source.on('job.dead-lettered', (job) => deadLettered.inc(labels(job)));
  source.on('job.rescued', (job) => {
    const l = labels(job);
    rescued.inc(l);
    if (!job.dead) retried.inc(l);
  });
  source.on('job.rate-limited', (job) => rateLimited.inc(labels(job)));
  source.on('relay.published', (info) => published.inc({ target: info.target }, info.count));
  source.on('consumer.duplicate', (event) => duplicates.inc({ group: event.group }));
}
