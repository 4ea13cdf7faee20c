/**
 * Prometheus metrics (`mailroom.metrics()`): every mailroom metric is read
 * from the real exposition after a workload that must move it (jobs that
 * complete, retry, dead-letter, get rate-limited, lose their lease; a relay
 * with unpublished and held-back events; a consumer's duplicates), with the
 * queue's owner as a label. Plus: the registry is made only on first use,
 * one stats() serves a scrape, and the desired-workers formula.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import {
  createMailroom,
  defineEvent,
  defineJob,
  desiredWorkers,
  handleEvent,
  PermanentError,
  RateLimitedError,
  RetryableError,
  ValidationError,
  type Mailroom,
  type MailroomEvents,
} from '../src/index.ts';
import { createMetrics } from '../src/observe/metrics.ts';
import { newId } from '../src/ids.ts';
import { testDatabases, type TestMailroom } from './helpers/databases.ts';
import { eventually } from './helpers/events.ts';
import { parseExposition, select, valueOf, type Exposition } from './helpers/exposition.ts';
import { flushUntil } from './helpers/relay.ts';

type Mode = 'ok' | 'later' | 'permanent' | 'limited';
const work = defineJob<{ mode: Mode }>('metrics.work', { queue: 'mx', retry: { maxAttempts: 3 } });
const parked = defineJob<Record<string, never>>('metrics.parked', { queue: 'mx-parked' });
const hang = defineJob<Record<string, never>>('metrics.hang', { queue: 'mr', retry: { maxAttempts: 2 } });
const noted = defineEvent<{ n: number }>('metrics.item-noted', { version: 1 });

/** Resolves when `mailroom` emitted `event` `count` times from now; rejects after `timeoutMs` saying how many it saw. */
function waitFor<E extends keyof MailroomEvents>(mailroom: Mailroom, event: E, count: number, timeoutMs = 15_000): Promise<void> {
  return new Promise((resolve, reject) => {
    let seen = 0;
    const listener = () => {
      if (++seen >= count) done(resolve);
    };
    const timer = setTimeout(() => done(() => reject(new Error(`timed out after ${timeoutMs} ms waiting for ${count} "${event}" events; saw ${seen}`))), timeoutMs);
    const done = (then: () => void) => {
      clearTimeout(timer);
      (mailroom as unknown as { off(e: string, l: () => void): void }).off(event, listener);
      then();
    };
    (mailroom as unknown as { on(e: string, l: () => void): void }).on(event, listener);
  });
}

/** Metrics of `t.mailroom` that read fresh stats on every scrape (the 1 s cache has its own test). */
function fresh(t: TestMailroom) {
  const metrics = createMetrics(t.mailroom, {}, { statsTtlMs: 0 });
  return async (): Promise<Exposition> => parseExposition(await metrics.text());
}

for (const db of testDatabases()) {
  describe(`metrics on ${db.name}`, () => {
    it('jobs: enqueued, depth by state, age, started, completed, failed, retried, dead-lettered, rate-limited, durations, dead letters, desired workers; owner labels', async () => {
      const t = await db.open({ queues: { mx: { owner: 'growth' } } });
      const { mailroom, schema } = t;
      const scrape = fresh(t);
      const growth = { queue: 'mx', owner: 'growth' };
      const jobOf = { ...growth, type: work.name };

      await mailroom.enqueueMany(work, [{ mode: 'ok' }, { mode: 'ok' }, { mode: 'later' }, { mode: 'permanent' }]);
      await mailroom.enqueue(work, { mode: 'limited' });
      await mailroom.enqueue(parked, {}, { delay: '1h' });
      await mailroom.enqueueMany(parked, [{}, {}], { orderingKey: 'k' });
      await t.sql(`UPDATE "${schema}".jobs SET run_at = now() - interval '30 seconds' WHERE queue = 'mx'`);

      let m = await scrape();
      assert.equal(valueOf(m, 'mailroom_jobs_enqueued_total', jobOf), 5);
      assert.equal(valueOf(m, 'mailroom_jobs', { ...growth, state: 'available' }), 5);
      for (const state of ['scheduled', 'retrying', 'blocked', 'active', 'dead']) assert.equal(valueOf(m, 'mailroom_jobs', { ...growth, state }), 0, state);
      const free = { queue: 'mx-parked', owner: '' };
      assert.equal(valueOf(m, 'mailroom_jobs_enqueued_total', { ...free, type: parked.name }), 3, 'an unowned queue has owner=""');
      assert.equal(valueOf(m, 'mailroom_jobs', { ...free, state: 'scheduled' }), 1);
      assert.equal(valueOf(m, 'mailroom_jobs', { ...free, state: 'available' }), 1);
      assert.equal(valueOf(m, 'mailroom_jobs', { ...free, state: 'blocked' }), 1, 'the second job of ordering key k waits behind the first');
      const age = valueOf(m, 'mailroom_oldest_job_age_seconds', growth);
      assert.ok(age >= 30 && age < 60, `oldest job age ${age}`);
      assert.equal(valueOf(m, 'mailroom_dead_letters', growth), 0);
      assert.equal(valueOf(m, 'mailroom_desired_workers', growth), 1, '5 jobs wait and nothing runs: one worker');
      assert.equal(valueOf(m, 'mailroom_desired_workers', free), 1);
      assert.equal(select(m, 'mailroom_jobs_started_total').length, 0);

      let limitedOnce = false;
      const worker = mailroom.worker({
        queues: ['mx'],
        concurrency: 2,
        pollInterval: 20,
        handlers: {
          [work.name]: async (job) => {
            const { mode } = job.data as { mode: Mode };
            if (mode === 'later') throw new RetryableError('provider busy', { after: '1h' });
            if (mode === 'permanent') throw new PermanentError('address rejected');
            if (mode === 'limited' && !limitedOnce) {
              limitedOnce = true;
              throw new RateLimitedError('slow down', { after: 10 });
            }
          },
        },
      });
      const finished = Promise.all([waitFor(mailroom, 'job.completed', 3), waitFor(mailroom, 'job.dead-lettered', 1), waitFor(mailroom, 'job.failed', 2)]);
      await worker.start();
      await finished;
      await worker.stop();

      m = await scrape();
      assert.equal(valueOf(m, 'mailroom_jobs_started_total', jobOf), 6, 'ok ×2, later, permanent, limited ×2');
      assert.equal(valueOf(m, 'mailroom_jobs_completed_total', jobOf), 3);
      assert.equal(valueOf(m, 'mailroom_jobs_failed_total', { ...jobOf, will_retry: 'true' }), 1);
      assert.equal(valueOf(m, 'mailroom_jobs_failed_total', { ...jobOf, will_retry: 'false' }), 1);
      assert.equal(valueOf(m, 'mailroom_jobs_retried_total', jobOf), 1);
      assert.equal(valueOf(m, 'mailroom_jobs_dead_lettered_total', jobOf), 1);
      assert.equal(valueOf(m, 'mailroom_jobs_rate_limited_total', jobOf), 1);
      for (const [outcome, n] of [['completed', 3], ['failed', 1], ['dead', 1]] as const) {
        const l = { ...jobOf, outcome };
        assert.equal(valueOf(m, 'mailroom_job_duration_seconds_count', l), n, outcome);
        assert.equal(valueOf(m, 'mailroom_job_duration_seconds_bucket', { ...l, le: '300' }), n);
        assert.equal(valueOf(m, 'mailroom_job_duration_seconds_bucket', { ...l, le: '+Inf' }), n);
        assert.ok(valueOf(m, 'mailroom_job_duration_seconds_sum', l) >= 0);
      }
      assert.equal(valueOf(m, 'mailroom_job_duration_seconds_bucket', { ...jobOf, outcome: 'completed', le: '0.001' }) <= 3, true);
      assert.equal(valueOf(m, 'mailroom_jobs', { ...growth, state: 'available' }), 0);
      assert.equal(valueOf(m, 'mailroom_jobs', { ...growth, state: 'retrying' }), 1, 'the job told to come back in an hour');
      assert.equal(valueOf(m, 'mailroom_jobs', { ...growth, state: 'dead' }), 1);
      assert.equal(valueOf(m, 'mailroom_dead_letters', growth), 1);
      assert.equal(valueOf(m, 'mailroom_oldest_job_age_seconds', growth), 0);
      assert.equal(valueOf(m, 'mailroom_desired_workers', growth), 0, 'nothing waits or runs');
      assert.equal(m.types.get('mailroom_job_duration_seconds'), 'histogram');
      assert.equal(m.types.get('mailroom_jobs_completed_total'), 'counter');
      assert.equal(m.types.get('mailroom_jobs'), 'gauge');
      // prom-client's default metrics: worker saturation.
      for (const name of ['nodejs_eventloop_lag_seconds', 'process_resident_memory_bytes', 'nodejs_heap_size_used_bytes']) assert.ok(select(m, name).length > 0, name);
      assert.ok(m.types.has('nodejs_gc_duration_seconds'));
    });

    it('a job whose lease expired: active while it runs, then rescued and counted as retried; an emptied queue reports 0', async () => {
      const t = await db.open();
      const { mailroom } = t;
      const scrape = fresh(t);
      const mr = { queue: 'mr', owner: '' };
      await mailroom.enqueue(hang, {});
      const worker = mailroom.worker({ queues: ['mr'], lease: 100, maintenance: false, pollInterval: 20, handlers: { [hang.name]: () => new Promise(() => {}) } });
      const started = waitFor(mailroom, 'job.started', 1);
      await worker.start();
      await started;
      let m = await scrape();
      assert.equal(valueOf(m, 'mailroom_jobs', { ...mr, state: 'active' }), 1);
      assert.equal(valueOf(m, 'mailroom_desired_workers', mr), 1);
      worker.abandon(); // as a crash: no heartbeats, no result
      await eventually(async () => (await mailroom.maintain()).rescued === 1, 10_000, 'the lease to expire and be rescued');
      m = await scrape();
      assert.equal(valueOf(m, 'mailroom_jobs_rescued_total', { ...mr, type: hang.name }), 1);
      assert.equal(valueOf(m, 'mailroom_jobs_retried_total', { ...mr, type: hang.name }), 1);
      assert.equal(valueOf(m, 'mailroom_jobs', { ...mr, state: 'active' }), 0);
      assert.equal(valueOf(m, 'mailroom_jobs', { ...mr, state: 'available' }), 1, 'due again at once');
      assert.equal(valueOf(m, 'mailroom_desired_workers', mr), 1);
      await t.sql(`DELETE FROM "${t.schema}".jobs WHERE queue = 'mr'`);
      m = await scrape();
      assert.equal(valueOf(m, 'mailroom_jobs', { ...mr, state: 'available' }), 0, 'a queue seen before stays, at 0');
      assert.equal(valueOf(m, 'mailroom_desired_workers', mr), 0);
    });

    it('relay and consumer: unpublished, lag and held back before delivery and 0 after; published; consumer lag; duplicates from the inbox and from events', async () => {
      const t = await db.open();
      const { mailroom, schema } = t;
      const scrape = fresh(t);
      const consumer = mailroom.consumer({ group: 'mxgroup', pollInterval: 20, handlers: { [noted.type]: handleEvent(noted, async () => {}) } });
      await consumer.start();
      const relay = mailroom.relay();
      await relay.flush(); // the internal target's cursor exists from here on

      await mailroom.publishMany(noted, [{ n: 1 }, { n: 2 }, { n: 3 }]);
      await t.sql(`UPDATE "${schema}".outbox SET created_at = now() - interval '30 seconds'`);
      let m = await scrape();
      const internal = { target: 'internal' };
      assert.equal(valueOf(m, 'mailroom_relay_unpublished', internal), 3);
      const lag = valueOf(m, 'mailroom_relay_lag_seconds', internal);
      assert.ok(lag >= 30 && lag < 60, `relay lag ${lag}`);
      // Held back counts events behind the server-wide snapshot horizon: a transaction of another
      // test file, open on the same server when these were published, holds them back until it ends.
      await eventually(async () => valueOf(await scrape(), 'mailroom_relay_held_back', internal) === 0, 10_000, 'held back 0 once no older transaction is open');
      assert.equal(valueOf(m, 'mailroom_consumer_lag', { group: 'mxgroup' }), 3, 'not fanned out yet');

      const handled = waitFor(mailroom, 'job.completed', 3);
      await flushUntil(relay, 3, 'internal', 15_000, mailroom);
      await handled;
      m = await scrape();
      assert.equal(valueOf(m, 'mailroom_relay_published_total', internal), 3);
      assert.equal(valueOf(m, 'mailroom_relay_unpublished', internal), 0);
      assert.equal(valueOf(m, 'mailroom_relay_lag_seconds', internal), 0);
      assert.equal(valueOf(m, 'mailroom_consumer_lag', { group: 'mxgroup' }), 0);
      assert.equal(valueOf(m, 'mailroom_consumer_duplicates_rejected_total', { group: 'mxgroup' }), 0);

      // An event whose transaction looks still open (an xid far beyond the fence) holds the relay back.
      await t.sql(
        `INSERT INTO "${schema}".outbox (xid, id, type, version, source, subject, time, data)
         VALUES ('1000000000000000'::xid8, $1, $2, 1, '/test', NULL, now(), '{"n": 9}'::jsonb)`,
        [newId(), noted.type],
      );
      m = await scrape();
      assert.equal(valueOf(m, 'mailroom_relay_held_back', internal), 1);
      await t.sql(`DELETE FROM "${schema}".outbox WHERE xid = '1000000000000000'::xid8`);
      m = await scrape();
      assert.equal(valueOf(m, 'mailroom_relay_held_back', internal), 0);

      // Redeliver every event (the jobs gone, the cursor rewound): the inbox refuses them.
      await t.sql(`DELETE FROM "${schema}".jobs WHERE queue = 'consumer.mxgroup'`);
      await t.sql(`UPDATE "${schema}".relay_cursors SET cursor_xid = '0', cursor_position = 0 WHERE target = 'internal'`);
      // The count commits with each job's completion (the event comes just before): wait for both.
      const duplicates = Promise.all([waitFor(mailroom, 'consumer.duplicate', 3), waitFor(mailroom, 'job.completed', 3)]);
      await flushUntil(relay, 3, 'internal', 15_000, mailroom);
      await duplicates;
      m = await scrape();
      assert.equal(valueOf(m, 'mailroom_consumer_duplicates_rejected_total', { group: 'mxgroup' }), 3);
      assert.equal(valueOf(m, 'mailroom_consumer_duplicates_seen_total', { group: 'mxgroup' }), 3);
      assert.equal(valueOf(m, 'mailroom_relay_published_total', internal), 6);
      assert.equal(m.types.get('mailroom_consumer_duplicates_rejected_total'), 'counter');
      await relay.stop();
      await consumer.stop();
    });

    it('table rows: live and dead row versions of mailroom\'s busiest tables from PostgreSQL\'s statistics (stats().tables and mailroom_table_rows)', async () => {
      const t = await db.open();
      const scrape = fresh(t);
      await t.mailroom.enqueueMany(parked, Array.from({ length: 50 }, () => ({})));
      await t.sql(`DELETE FROM "${t.schema}".jobs WHERE id IN (SELECT id FROM "${t.schema}".jobs LIMIT 20)`);
      if (db.name === 'postgres') await t.sql('SELECT pg_stat_force_next_flush()'); // this backend's counts, now
      const { tables } = await t.mailroom.stats();
      assert.ok(tables.jobs, `the jobs table is reported: ${JSON.stringify(tables)}`);
      if (db.name === 'postgres') {
        // Another session reads the counts: the statistics are approximate but these are exact here (no vacuum ran).
        assert.deepEqual([tables.jobs.liveRows, tables.jobs.deadRows], [30, 20]);
        const exposition = await scrape();
        assert.equal(valueOf(exposition, 'mailroom_table_rows', { table: 'jobs', kind: 'dead' }), 20);
        assert.equal(valueOf(exposition, 'mailroom_table_rows', { table: 'jobs', kind: 'live' }), 30);
      } else {
        assert.ok(tables.jobs.liveRows >= 0 && tables.jobs.deadRows >= 0, 'PGlite keeps no statistics to speak of: numbers, maybe zero');
      }
      assert.deepEqual(Object.keys(tables).filter((name) => !['jobs', 'job_errors', 'outbox', 'outbox_keys', 'inbox', 'ordering_keys', 'idempotency_keys'].includes(name)), []);
    });

    it('mailroom.metrics(): the registry is made on first use (no listeners before), is the instance\'s own, and one stats() serves a scrape', async () => {
      const t = await db.open({ metrics: { prefix: 'app_' } });
      const { mailroom } = t;
      assert.equal(mailroom.listenerCount('job.completed'), 0, 'nothing subscribed before metrics are used');
      let calls = 0;
      const stats = mailroom.stats.bind(mailroom);
      mailroom.stats = () => {
        calls++;
        return stats();
      };
      const registry = mailroom.metricsRegistry;
      assert.equal(mailroom.metricsRegistry, registry);
      assert.ok(mailroom.listenerCount('job.completed') > 0);
      assert.match(mailroom.metricsContentType, /^text\/plain/);
      await mailroom.enqueue(parked, {});
      const first = parseExposition(await mailroom.metrics());
      assert.equal(calls, 1, 'eight gauges, one stats() call');
      assert.equal(valueOf(first, 'app_mailroom_jobs', { queue: 'mx-parked', owner: '', state: 'available' }), 1);
      assert.equal(valueOf(first, 'app_mailroom_jobs_enqueued_total', { queue: 'mx-parked', owner: '', type: parked.name }), 1);
      assert.ok(select(first, 'app_process_resident_memory_bytes').length > 0, 'the prefix applies to the default metrics too');
      assert.equal(select(first, 'mailroom_jobs').length, 0);
      await mailroom.metrics();
      assert.equal(calls, 1, 'a second scrape within a second reuses the numbers');
      const other = await db.open();
      assert.notEqual(other.mailroom.metricsRegistry, registry, 'one registry per instance');
      assert.equal(select(parseExposition(await other.mailroom.metrics()), 'mailroom_jobs_enqueued_total').length, 0, 'the other instance counted nothing');
    });
  });
}

describe('metrics options and the desired-workers formula', () => {
  it('bad metrics options are refused at createMailroom, naming the option', async () => {
    for (const [metrics, name] of [
      [{ drainTargetSeconds: 0 }, 'metrics.drainTargetSeconds'],
      [{ workerConcurrency: 2.5 }, 'metrics.workerConcurrency'],
      [{ prefix: '9x' }, 'metrics.prefix'],
    ] as const) {
      await assert.rejects(createMailroom({ metrics }), (e: unknown) => e instanceof ValidationError && e.message.startsWith(name), name);
    }
  });

  it('desiredWorkers: 0 when idle, 1 when work waits and nothing is known, busy slots plus draining the backlog within what is left of the target', () => {
    const o = { drainTargetSeconds: 60, workerConcurrency: 10 };
    const q = { available: 0, active: 0, oldestAgeSeconds: 0, completedPerSecond: 0, failedPerSecond: 0 };
    assert.equal(desiredWorkers(q, o), 0);
    assert.equal(desiredWorkers({ ...q, available: 3, oldestAgeSeconds: 500 }, o), 1, 'no throughput yet: one worker to start with');
    assert.equal(desiredWorkers({ ...q, active: 20, available: 50 }, o), 3, 'nothing finished in a minute: one more worker than the busy slots need');
    // 10 busy slots, 20 jobs/s: 0.5 s per job. 600 waiting × 0.5 s / 60 s = 5 more slots: 15 slots, 2 workers.
    const busy = { ...q, active: 10, completedPerSecond: 18, failedPerSecond: 2 };
    assert.equal(desiredWorkers({ ...busy, available: 600 }, o), 2);
    // The oldest waited 45 s: 15 s left, so 20 more slots: 30 slots, 3 workers.
    assert.equal(desiredWorkers({ ...busy, available: 600, oldestAgeSeconds: 45 }, o), 3);
    // Past the target the window stays at a quarter of it (15 s): the same 3, not infinity.
    assert.equal(desiredWorkers({ ...busy, available: 600, oldestAgeSeconds: 600 }, o), 3);
    assert.equal(desiredWorkers({ ...busy, available: 600 }, { drainTargetSeconds: 30, workerConcurrency: 10 }), 2, '10 + 10 = 20 slots: exactly 2');
    assert.equal(desiredWorkers({ ...busy, available: 600 }, { drainTargetSeconds: 60, workerConcurrency: 4 }), 4, '15 slots of 4');
  });
});
