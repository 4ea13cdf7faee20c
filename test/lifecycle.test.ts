/**
 * Lifecycle events on `mailroom.on(...)` (PGlite, and PostgreSQL with
 * TEST_DATABASE_URL): each event fires for the workload that must cause it,
 * with the job's queue, attempt and correlation id; a listener that throws,
 * or rejects, never breaks processing.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { defineEvent, defineJob, handleEvent, PermanentError, RateLimitedError, snooze, type Job, type Mailroom, type MailroomEvents } from '../src/index.ts';
import { testDatabases } from './helpers/databases.ts';
import { eventually, freezeHeartbeats, waitForEvents } from './helpers/events.ts';

type Seen = { [K in keyof MailroomEvents]?: MailroomEvents[K][0][] };

/** Records every lifecycle event of `mailroom` by name. */
function record(mailroom: Mailroom): Seen {
  const seen: Seen = {};
  const names: (keyof MailroomEvents)[] = [
    'job.enqueued',
    'job.started',
    'job.completed',
    'job.failed',
    'job.dead-lettered',
    'job.rescued',
    'job.snoozed',
    'job.rate-limited',
    'job.stale',
    'relay.published',
    'relay.held-back',
    'consumer.duplicate',
  ];
  for (const name of names) {
    (mailroom.on as (n: string, l: (info: unknown) => void) => unknown).call(mailroom, name, (info) => {
      ((seen[name] ??= []) as unknown[]).push(info);
    });
  }
  return seen;
}

for (const db of testDatabases()) {
  describe(`lifecycle events on ${db.name}`, () => {
    it('enqueued, started, completed, failed (will retry), dead-lettered, snoozed and rate-limited fire once each with the job they are about (and the delay asked for)', async () => {
      const { mailroom } = await db.open();
      const seen = record(mailroom);
      const job = defineJob<{ do: string }>('life.outcomes', { queue: 'life', retry: { maxAttempts: 2, backoff: { base: 1, max: 1 } } });
      const snoozed = new Set<string>();
      const limited = new Set<string>();
      const handler = (j: Job<{ do: string }>) => {
        if (j.data.do === 'flaky' && j.attempt === 1) throw new Error('first attempt fails');
        if (j.data.do === 'bad') throw new PermanentError('refused for good');
        if (j.data.do === 'snooze' && !snoozed.has(j.id)) {
          snoozed.add(j.id);
          return snooze(5);
        }
        if (j.data.do === 'limit' && !limited.has(j.id)) {
          limited.add(j.id);
          throw new RateLimitedError('provider says slow down', { after: 3 });
        }
        return undefined;
      };
      const [ok, flaky, bad, sleepy, throttled] = await mailroom.enqueueMany(
        job,
        ['ok', 'flaky', 'bad', 'snooze', 'limit'].map((d) => ({ do: d })),
        { correlationId: 'req-42' },
      );
      assert.deepEqual(seen['job.enqueued'], [{ type: 'life.outcomes', queue: 'life', ids: [ok, flaky, bad, sleepy, throttled], inTransaction: false }]);
      const worker = mailroom.worker({ queues: ['life'], concurrency: 2, pollInterval: 10, handlers: { [job.name]: handler } });
      const done = waitForEvents(worker, 'completed', 4);
      await worker.start();
      await done;
      await eventually(() => (seen['job.dead-lettered']?.length ?? 0) === 1, 10_000, 'the dead letter');
      await worker.stop();

      const completed = seen['job.completed'] ?? [];
      assert.deepEqual(completed.map((j) => j.id).sort(), [ok, flaky, sleepy, throttled].sort());
      for (const j of completed) {
        assert.equal(j.queue, 'life');
        assert.equal(j.correlationId, 'req-42');
        assert.ok(j.durationMs >= 0 && j.durationMs < 10_000, `a handler duration in ms, got ${j.durationMs}`);
      }
      assert.equal(completed.find((j) => j.id === flaky)?.attempt, 2);
      const failed = seen['job.failed'] ?? [];
      assert.deepEqual(
        failed.map((f) => [f.id, f.attempt, f.willRetry, f.category]).sort(),
        [
          [flaky, 1, true, 'transient'],
          [bad, 1, false, 'permanent'],
        ].sort(),
      );
      assert.ok(failed.find((f) => f.id === flaky)?.runAt instanceof Date, 'a retry says when it runs next');
      assert.deepEqual(
        (seen['job.dead-lettered'] ?? []).map((d) => [d.id, d.category, d.message, d.queue]),
        [[bad, 'permanent', 'refused for good', 'life']],
      );
      assert.deepEqual((seen['job.snoozed'] ?? []).map((s) => [s.id, s.delayMs]), [[sleepy, 5]]);
      assert.deepEqual((seen['job.rate-limited'] ?? []).map((s) => [s.id, s.delayMs]), [[throttled, 3]]);
      // Every attempt started: 5 first runs, the retry, the snoozed and the rate-limited runs again.
      assert.equal(seen['job.started']?.length, 8);
      assert.ok(seen['job.started']?.every((s) => s.worker === worker.id));
    });

    it('an enqueue inside a transaction says so', async () => {
      const { mailroom } = await db.open();
      const seen = record(mailroom);
      const job = defineJob('life.tx', { queue: 'life-tx' });
      const id = await mailroom.transaction((tx) => mailroom.enqueue(job, {}, { tx }));
      assert.deepEqual(seen['job.enqueued'], [{ type: 'life.tx', queue: 'life-tx', ids: [id], inTransaction: true }]);
    });

    it('a job whose lease expired is reported rescued, and dead-lettered when it was its last attempt', async () => {
      const { mailroom } = await db.open();
      const seen = record(mailroom);
      const job = defineJob('life.rescue', { queue: 'life-rescue', retry: { maxAttempts: 1 } });
      const id = await mailroom.enqueue(job, {});
      let release!: () => void;
      const gate = new Promise<void>((r) => (release = r));
      const worker = mailroom.worker({ queues: ['life-rescue'], lease: 100, maintenance: false, handlers: { [job.name]: () => gate } });
      const started = waitForEvents(worker, 'started', 1);
      await worker.start();
      await started;
      freezeHeartbeats(worker); // as if the process were paused: the lease runs out
      await eventually(async () => (await mailroom.maintain()).rescued === 1, 10_000, 'the rescue');
      release();
      await worker.stop();
      assert.deepEqual(seen['job.rescued'], [{ id, queue: 'life-rescue', type: 'life.rescue', attempt: 1, dead: true }]);
      assert.deepEqual(
        (seen['job.dead-lettered'] ?? []).map((d) => [d.id, d.category]),
        [[id, 'lease-expired']],
      );
      assert.deepEqual((seen['job.stale'] ?? []).map((s) => s.id), [id], 'the paused attempt finds its result refused');
    });

    it('a relay reports what it published, and a consumer the duplicates its inbox refused', async () => {
      const t = await db.open();
      const { mailroom, schema } = t;
      const seen = record(mailroom);
      const pinged = defineEvent<{ n: number }>('life.pinged', { version: 1 });
      const consumer = mailroom.consumer({ group: 'life-group', pollInterval: 20, handlers: { [pinged.type]: handleEvent(pinged, () => {}) } });
      await consumer.start();
      const relay = mailroom.relay();
      const first = waitForEvents(consumer.worker, 'completed', 2);
      await mailroom.publishMany(pinged, [{ n: 1 }, { n: 2 }]);
      while ((await relay.flush()).internal?.delivered === 0);
      await first;
      assert.deepEqual(seen['relay.published'], [{ target: 'internal', count: 2 }]);
      // Redeliver both: the fan-out makes new jobs, the inbox refuses them.
      await t.sql(`DELETE FROM "${schema}".jobs WHERE queue = 'consumer.life-group'`);
      await t.sql(`UPDATE "${schema}".relay_cursors SET cursor_xid = '0', cursor_position = 0 WHERE target = 'internal'`);
      const again = waitForEvents(consumer.worker, 'completed', 2);
      await relay.flush();
      await again;
      await consumer.stop();
      await relay.stop();
      assert.equal(seen['consumer.duplicate']?.length, 2);
      assert.ok(seen['consumer.duplicate']?.every((d) => d.group === 'life-group' && d.type === 'life.pinged'));
      // The consumer's jobs are reported like any other: queue consumer.<group>.
      assert.ok((seen['job.completed'] ?? []).some((j) => j.queue === 'consumer.life-group'));
    });

    it('listeners that throw or reject are logged, and every job still completes once', async () => {
      const { mailroom } = await db.open();
      const job = defineJob<{ n: number }>('life.throwing', { queue: 'life-throw' });
      const logged: string[] = [];
      const originalError = console.error;
      console.error = (...args: unknown[]) => void logged.push(args.join(' '));
      try {
        mailroom.on('job.started', () => {
          throw new Error('listener bug');
        });
        mailroom.on('job.completed', async () => {
          throw new Error('async listener bug');
        });
        mailroom.on('job.enqueued', () => {
          throw new Error('enqueue listener bug');
        });
        const ran: number[] = [];
        const ids = await mailroom.enqueueMany(job, Array.from({ length: 20 }, (_, n) => ({ n })));
        assert.equal(ids.length, 20, 'the enqueue returned its ids despite the listener');
        const worker = mailroom.worker({ queues: ['life-throw'], concurrency: 4, handlers: { [job.name]: (j: Job<{ n: number }>) => void ran.push(j.data.n) } });
        const done = waitForEvents(worker, 'completed', 20);
        await worker.start();
        await done;
        await worker.stop();
        assert.deepEqual([...ran].sort((a, b) => a - b), Array.from({ length: 20 }, (_, n) => n));
        for (const id of ids) assert.equal((await mailroom.jobs.get(id))?.state, 'completed');
        await eventually(() => logged.filter((l) => l.includes('async listener bug')).length === 20, 5000, 'the rejected listeners logged');
        assert.equal(logged.filter((l) => l.includes('"job.started" threw') && l.includes('listener bug')).length, 20);
        assert.equal(logged.filter((l) => l.includes('enqueue listener bug')).length, 1);
      } finally {
        console.error = originalError;
      }
    });
  });
}
