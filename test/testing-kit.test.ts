/**
 * mailroom/testing: the in-memory test mailroom, reading back what was
 * enqueued and published, and running jobs and events to the end with the
 * real worker, consumer and relay (PGlite, and PostgreSQL when set).
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import pg from 'pg';
import { cancel, defineEvent, defineJob, handle, handleEvent, MailroomError, PermanentError, snooze, ValidationError, type ConsumerSource } from '../src/index.ts';
import { createTestMailroom, deliverEvents, enqueuedJobs, publishedEvents, runJobs } from '../src/testing/index.ts';
import { WASM_FLAGS } from './helpers/wasm-flags.ts';
import { databaseUrl, testDatabases, uniqueSchema } from './helpers/databases.ts';

const welcome = defineJob<{ email: string }>('kit.welcome', { queue: 'kit-email' });
const report = defineJob<{ n: number }>('kit.report', { queue: 'kit-reports' });
const flaky = defineJob<{ n: number }>('kit.flaky', { queue: 'kit-flaky', retry: { maxAttempts: 3, backoff: { base: '1h', max: '1h' } } });
const sleepy = defineJob<{ n: number }>('kit.sleepy', { queue: 'kit-sleepy' });
const ordered = defineJob<{ n: number }>('kit.ordered', { queue: 'kit-ordered' });
const placed = defineEvent<{ order: string; cents: number }>('kit.order-placed', { version: 2 });
const billed = defineEvent<{ order: string }>('kit.order-billed', { version: 1 });

describe('createTestMailroom', () => {
  it('gives each call a migrated schema of its own on an in-memory database: one test does not see the other\'s jobs, and close drops the schema', async () => {
    const a = await createTestMailroom();
    const b = await createTestMailroom();
    const named = await createTestMailroom({ schema: 'kit_named' });
    try {
      assert.equal(a.databaseKind, 'pglite');
      assert.notEqual(a.schema, b.schema);
      await a.enqueue(welcome, { email: 'ada@example.com' });
      await named.enqueue(welcome, { email: 'named@example.com' });
      assert.equal((await enqueuedJobs(a, welcome)).length, 1);
      assert.deepEqual(await enqueuedJobs(b, welcome), [], 'the second mailroom is its own');
    } finally {
      await a.close();
      await b.close();
      await named.close();
    }
    const again = await createTestMailroom({ schema: 'kit_named' });
    try {
      assert.deepEqual(await enqueuedJobs(again, welcome), [], 'the schema was dropped on close');
      const { rows } = await again.transaction((tx) => tx.query<{ n: number }>(`SELECT count(*)::int AS n FROM pg_namespace WHERE nspname = $1`, [a.schema]));
      assert.equal(rows[0]?.n, 0, 'the first test\'s schema is gone');
    } finally {
      await again.close();
    }
  });

  it('lets the process exit promptly once every test mailroom is closed, and opens the database again on the next call', async () => {
    // PGlite arms a 10 s timer after most statements that nothing clears: the shared database kept a
    // process alive about 10 s after the last close (measured 9978 and 10093 ms from close to exit), now about 0.5 s.
    const kit = new URL('../src/testing/index.ts', import.meta.url).href;
    const script = `
      const { createTestMailroom } = await import(${JSON.stringify(kit)});
      const [a, b] = await Promise.all([createTestMailroom(), createTestMailroom()]);
      await a.transaction((tx) => tx.query('CREATE SCHEMA kit_exit_marker'));
      await Promise.all([a.close(), b.close()]);
      await new Promise((resolve) => setTimeout(resolve, 1500));
      const c = await createTestMailroom();
      const { rows } = await c.transaction((tx) => tx.query("SELECT count(*)::int AS n FROM pg_namespace WHERE nspname = 'kit_exit_marker'"));
      await c.close();
      console.log('closed ' + rows[0].n);
    `;
    const child = spawn(process.execPath, [...WASM_FLAGS, '--import', 'tsx', '--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    let closedAt = 0;
    child.stdout.on('data', (chunk: Buffer) => {
      out += chunk.toString();
      if (closedAt === 0 && out.includes('closed')) closedAt = Date.now();
    });
    child.stderr.on('data', (chunk: Buffer) => (err += chunk.toString()));
    const code = await new Promise<number | null>((resolve) => child.on('exit', (c) => resolve(c)));
    const lingered = Date.now() - closedAt;
    assert.equal(code, 0, err);
    assert.ok(lingered < 3000, `the child exited ${lingered} ms after its last close`);
    assert.match(out, /closed 0/, 'a call after the database was idle opens a new one (the first one\'s schema is not there)');
  });

  it('keeps the database for a mailroom opened right after the last close (no second start)', async () => {
    const a = await createTestMailroom();
    await a.transaction((tx) => tx.query('CREATE SCHEMA IF NOT EXISTS kit_reuse_marker'));
    await a.close();
    await a.close(); // a second close is harmless and does not give the database back twice
    const b = await createTestMailroom();
    try {
      const { rows } = await b.transaction((tx) => tx.query<{ n: number }>(`SELECT count(*)::int AS n FROM pg_namespace WHERE nspname = 'kit_reuse_marker'`));
      assert.equal(rows[0]?.n, 1, 'the same database');
      await b.transaction((tx) => tx.query('DROP SCHEMA kit_reuse_marker'));
    } finally {
      await b.close();
    }
  });

  it('is the package export mailroom/testing (built to dist)', async () => {
    const kit = (await import('mailroom/testing')) as Record<string, unknown>;
    for (const name of ['createTestMailroom', 'enqueuedJobs', 'publishedEvents', 'runJobs', 'deliverEvents']) assert.equal(typeof kit[name], 'function', name);
  });

  it('checks options as createMailroom does, before opening anything', async () => {
    await assert.rejects(createTestMailroom({ schema: 'Bad Schema' }), (e: unknown) => e instanceof ValidationError && /schema/.test(e.message));
    await assert.rejects(createTestMailroom({ poolSize: 1 }), (e: unknown) => e instanceof ValidationError && /poolSize/.test(e.message));
  });

  it('opens a server database when given one, in the schema asked for', { skip: !databaseUrl && 'set TEST_DATABASE_URL' }, async () => {
    const schema = uniqueSchema('kit');
    const mailroom = await createTestMailroom({ database: databaseUrl!, schema });
    try {
      assert.equal(mailroom.databaseKind, 'pg');
      await mailroom.enqueue(welcome, { email: 'grace@example.com' });
      const [job] = await enqueuedJobs(mailroom, welcome);
      assert.equal(job?.data.email, 'grace@example.com');
      const { rows } = await mailroom.transaction((tx) => tx.query<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs`));
      assert.equal(rows[0]?.n, 1, 'the job is in the schema asked for');
      await mailroom.transaction((tx) => tx.query(`DROP SCHEMA "${schema}" CASCADE`));
    } finally {
      await mailroom.close();
    }
  });
});

for (const db of testDatabases()) {
  describe(`mailroom/testing on ${db.name}`, () => {
    it('enqueuedJobs: the jobs of one definition with their data, key, ordering key and run time; other states on request', async () => {
      const { mailroom } = await db.open();
      const later = new Date(Date.now() + 3_600_000);
      await mailroom.enqueue(welcome, { email: 'a@example.com' }, { key: 'user-1', correlationId: 'req-1', priority: 3 });
      await mailroom.enqueue(welcome, { email: 'b@example.com' }, { orderingKey: 'user-2', runAt: later });
      await mailroom.enqueue(report, { n: 1 });
      const jobs = await enqueuedJobs(mailroom, welcome);
      assert.deepEqual(
        jobs.map((j) => [j.data.email, j.state, j.key, j.orderingKey, j.correlationId, j.priority, j.queue]),
        [
          ['a@example.com', 'available', 'user-1', null, 'req-1', 3, 'kit-email'],
          ['b@example.com', 'scheduled', null, 'user-2', null, 0, 'kit-email'],
        ],
      );
      assert.equal(jobs[1]!.runAt.getTime(), later.getTime());
      assert.ok(jobs[0]!.createdAt instanceof Date);
      await runJobs(mailroom, { queues: ['kit-email'], handlers: { [welcome.name]: async () => {} } });
      assert.deepEqual((await enqueuedJobs(mailroom, welcome)).map((j) => j.data.email), ['b@example.com'], 'the completed one is no longer waiting');
      assert.deepEqual((await enqueuedJobs(mailroom, welcome, { states: ['completed'] })).map((j) => j.data.email), ['a@example.com']);
      assert.equal((await enqueuedJobs(mailroom, welcome, { states: 'all' })).length, 2);
      for (const states of [[], ['done'], 'some']) {
        await assert.rejects(
          enqueuedJobs(mailroom, welcome, { states: states as never }),
          (e: unknown) => e instanceof ValidationError && /states must be 'all' or a non-empty list/.test(e.message),
        );
      }
    });

    it('publishedEvents: committed events of one definition in publish order, with key, version and correlation; a rolled-back publish is not there', async () => {
      const { mailroom } = await db.open();
      await mailroom.publish(placed, { order: 'o-1', cents: 100 }, { key: 'o-1', correlationId: 'req-9' });
      await mailroom
        .transaction(async (tx) => {
          await mailroom.publish(placed, { order: 'o-lie', cents: 1 }, { tx, key: 'o-lie' });
          throw new Error('the order was not saved');
        })
        .catch(() => undefined);
      await mailroom.publishMany(placed, [{ order: 'o-2', cents: 200 }, { order: 'o-3', cents: 300 }], { key: (d) => d.order });
      await mailroom.publish(billed, { order: 'o-1' });
      const events = await publishedEvents(mailroom, placed);
      assert.deepEqual(
        events.map((e) => [e.data.order, e.data.cents, e.key, e.version]),
        [
          ['o-1', 100, 'o-1', 2],
          ['o-2', 200, 'o-2', 2],
          ['o-3', 300, 'o-3', 2],
        ],
      );
      assert.equal(events[0]!.correlationId, 'req-9');
      assert.ok(BigInt(events[0]!.position) < BigInt(events[1]!.position));
      assert.deepEqual((await publishedEvents(mailroom, billed)).map((e) => e.data.order), ['o-1']);
    });

    it('runJobs: runs every due job and the jobs they enqueue, leaves other queues and later jobs alone, and counts the outcomes', async () => {
      const { mailroom } = await db.open();
      const sent: string[] = [];
      await mailroom.enqueueMany(welcome, [{ email: 'a@example.com' }, { email: 'b@example.com' }]);
      await mailroom.enqueue(welcome, { email: 'later@example.com' }, { delay: '1h' });
      await mailroom.enqueue(report, { n: 1 });
      const result = await runJobs(mailroom, {
        queues: ['kit-email'],
        handlers: {
          [welcome.name]: handle(welcome, async (job) => {
            sent.push(job.data.email);
            if (job.data.email === 'a@example.com') await mailroom.enqueue(welcome, { email: 'follow-up@example.com' });
            if (job.data.email === 'follow-up@example.com') return cancel('unsubscribed meanwhile');
          }),
        },
      });
      assert.deepEqual(sent.sort(), ['a@example.com', 'b@example.com', 'follow-up@example.com']);
      assert.deepEqual([result.completed, result.retrying, result.dead, result.snoozed, result.cancelled], [2, 0, 0, 0, 1]);
      assert.deepEqual((await enqueuedJobs(mailroom, welcome)).map((j) => j.data.email), ['later@example.com'], 'the later job still waits');
      assert.deepEqual((await enqueuedJobs(mailroom, report)).map((j) => j.state), ['available'], 'another queue is not touched');
    });

    it('runJobs: a failure is retried later, or at once with runScheduled until the job is dead; a permanent error goes dead at once', async () => {
      const { mailroom } = await db.open();
      await mailroom.enqueue(flaky, { n: 1 });
      const failing = { [flaky.name]: async () => Promise.reject(new Error('smtp down')) };
      const first = await runJobs(mailroom, { queues: ['kit-flaky'], handlers: failing });
      assert.deepEqual([first.completed, first.retrying, first.dead], [0, 1, 0]);
      assert.deepEqual(first.failures.map((f) => [f.type, f.attempt, f.category, f.message, f.dead]), [[flaky.name, 1, 'transient', 'smtp down', false]]);
      assert.deepEqual((await enqueuedJobs(mailroom, flaky)).map((j) => j.state), ['retrying'], 'its backoff (an hour) is left to run');
      const rest = await runJobs(mailroom, { queues: ['kit-flaky'], handlers: failing, runScheduled: true });
      assert.deepEqual([rest.retrying, rest.dead], [1, 1], 'attempts 2 and 3 at once, the third dead');
      assert.deepEqual((await enqueuedJobs(mailroom, flaky, { states: ['dead'] })).map((j) => j.attempt), [3]);
      await mailroom.enqueue(flaky, { n: 2 });
      const permanent = await runJobs(mailroom, { queues: ['kit-flaky'], handlers: { [flaky.name]: async () => Promise.reject(new PermanentError('bad address')) } });
      assert.deepEqual([permanent.retrying, permanent.dead, permanent.failures[0]?.message], [0, 1, 'bad address']);
    });

    it('runJobs: jobs with one ordering key run one after another, in enqueue order', async () => {
      const { mailroom } = await db.open();
      for (let n = 1; n <= 5; n++) await mailroom.enqueue(ordered, { n }, { orderingKey: 'account-1' });
      const seen: number[] = [];
      let running = 0;
      const result = await runJobs(mailroom, {
        queues: ['kit-ordered'],
        concurrency: 5,
        handlers: {
          [ordered.name]: handle(ordered, async (job) => {
            running++;
            assert.equal(running, 1, 'one at a time');
            await new Promise((r) => setTimeout(r, 5));
            seen.push(job.data.n);
            running--;
          }),
        },
      });
      assert.equal(result.completed, 5);
      assert.deepEqual(seen, [1, 2, 3, 4, 5]);
    });

    it('runJobs: a handler that never ends its job fails with the timeout, naming what is left, and leaves no worker running', async () => {
      const { mailroom } = await db.open();
      await mailroom.enqueue(sleepy, { n: 1 });
      let runs = 0;
      const started = Date.now();
      await assert.rejects(
        runJobs(mailroom, { queues: ['kit-sleepy'], runScheduled: true, timeout: 300, handlers: { [sleepy.name]: async () => (runs++, snooze('1h')) } }),
        (e: unknown) => e instanceof MailroomError && /runJobs: still \d+ job\(s\) due and \d+ running in kit-sleepy after 300 ms/.test(e.message),
      );
      assert.ok(Date.now() - started < 10_000);
      assert.ok(runs > 1, `snoozed and run again at once (${runs} runs)`);
      const after = runs;
      await new Promise((r) => setTimeout(r, 100));
      assert.equal(runs, after, 'the worker was stopped');
      assert.deepEqual((await enqueuedJobs(mailroom, sleepy, { states: ['active'] })).length, 0, 'no job left active');
      await assert.rejects(runJobs(mailroom, { queues: ['kit-sleepy'], handlers: {}, timeout: 'soon' as never }), /timeout/);
    });

    it('deliverEvents: relays events published before the group existed, runs its handlers once each, and follows events they publish', async () => {
      const { mailroom } = await db.open();
      await mailroom.publish(placed, { order: 'o-1', cents: 100 }, { key: 'o-1' });
      await mailroom.publish(placed, { order: 'o-2', cents: 250 }, { key: 'o-2' });
      const billedOrders: string[] = [];
      const handlers = {
        [placed.type]: handleEvent(placed, async (event) => {
          await mailroom.publish(billed, { order: event.data.order }, { key: event.data.order });
        }),
        [billed.type]: handleEvent(billed, async (event) => {
          billedOrders.push(event.data.order);
        }),
      };
      const result = await deliverEvents(mailroom, { group: 'kit-billing', handlers });
      assert.deepEqual(billedOrders.sort(), ['o-1', 'o-2']);
      assert.deepEqual([result.completed, result.retrying, result.dead, result.duplicates], [4, 0, 0, 0]);
      const again = await deliverEvents(mailroom, { group: 'kit-billing', handlers });
      assert.equal(again.completed, 0, 'nothing is delivered twice');
      assert.deepEqual(billedOrders.sort(), ['o-1', 'o-2']);
    });

    it('deliverEvents: with a relay of the test\'s own holding the internal target, waits until that relay has delivered every event', { skip: db.name !== 'postgres' && 'an open transaction on a second connection needs a server' }, async () => {
      const { mailroom } = await db.open();
      const running = mailroom.relay();
      await running.start(); // holds the internal target: deliverEvents' own relay gets no lease
      // A transaction open from before the publish holds the event back (the fence) until it ends.
      const blocker = new pg.Client({ connectionString: databaseUrl! });
      await blocker.connect();
      try {
        await blocker.query('BEGIN');
        await blocker.query('SELECT pg_current_xact_id()');
        await mailroom.publish(billed, { order: 'o-5' });
        const handled: string[] = [];
        const delivering = deliverEvents(mailroom, {
          group: 'kit-alongside',
          timeout: '20s',
          handlers: { [billed.type]: handleEvent(billed, async (event) => void handled.push(event.data.order)) },
        });
        setTimeout(() => void blocker.query('COMMIT'), 500);
        const result = await delivering;
        assert.deepEqual(handled, ['o-5'], 'the running relay delivered it once the transaction ended, and the drain waited for it');
        assert.equal(result.completed, 1);
      } finally {
        await blocker.end();
        await running.stop();
      }
    });

    it('deliverEvents: a failing handler is retried (runScheduled) and dead-lettered like any group job; a broker source is refused', async () => {
      const { mailroom } = await db.open();
      await mailroom.publish(placed, { order: 'o-9', cents: 1 });
      const result = await deliverEvents(mailroom, {
        group: 'kit-failing',
        retry: { maxAttempts: 2, backoff: { base: '1h', max: '1h' } },
        runScheduled: true,
        handlers: { [placed.type]: async () => Promise.reject(new Error('ledger locked')) },
      });
      assert.deepEqual([result.completed, result.retrying, result.dead], [0, 1, 1]);
      assert.equal((await mailroom.deadLetters.list({ queue: 'consumer.kit-failing' })).items.length, 1);
      const source = { kind: 'fake', name: 'fake' } as unknown as ConsumerSource;
      await assert.rejects(
        deliverEvents(mailroom, { group: 'kit-broker', handlers: {}, source } as never),
        (e: unknown) => e instanceof ValidationError && /broker source is not taken/.test(e.message),
      );
    });
  });
}
