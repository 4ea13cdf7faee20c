/**
 * Consumers and the inbox: ctx.tx work, the inbox key and the job's
 * completion commit together; a redelivered event takes effect once and is
 * counted; new groups start at 'now' or 'earliest'; the inbox retention must
 * outlast the retry horizon; per-key order, retries and stats.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { z } from 'zod';
import { cancel, defaultClassifier, defineEvent, handleEvent, RetryableError, snooze, ValidationError, type ConsumedEvent, type ConsumerContext } from '../src/index.ts';
import { consumerQueries } from '../src/consumers/consumer-queries.ts';
import { testDatabases, type TestMailroom } from './helpers/databases.ts';
import { explainPrepared, itPlans, PLAN_MODES } from './helpers/plans.ts';
import { waitForEvents } from './helpers/events.ts';
import { flushUntil } from './helpers/relay.ts';

const credited = defineEvent<{ account: string; cents: number }>('consumer.account-credited', { version: 2 });
const other = defineEvent<{ n: number }>('consumer.other-happened', { version: 1 });
const placedV1 = defineEvent('consumer.order-placed', { version: 1, schema: z.object({ orderId: z.string(), total: z.number().default(0) }) });
const placedV2 = defineEvent('consumer.order-placed', { version: 2, schema: z.object({ orderId: z.number() }) });
const paid = defineEvent('consumer.amount-paid', { version: 1, schema: z.object({ amount: z.string().transform(Number) }) });

async function balances(t: TestMailroom): Promise<Record<string, number>> {
  const rows = await t.sql<{ id: string; balance: number }>(`SELECT id, balance FROM "${t.schema}".accounts ORDER BY id`);
  return Object.fromEntries(rows.map((r) => [r.id, r.balance]));
}

async function withAccounts(t: TestMailroom): Promise<void> {
  await t.sql(`CREATE TABLE "${t.schema}".accounts (id text PRIMARY KEY, balance int NOT NULL DEFAULT 0)`);
  await t.sql(`INSERT INTO "${t.schema}".accounts (id) VALUES ('a'), ('b')`);
}

for (const db of testDatabases()) {
  describe(`consumers on ${db.name}`, () => {
    it('the handler\'s ctx.tx work commits with the inbox key and the completion; a failure rolls back and retries; per-key order holds', async () => {
      const t = await db.open();
      await withAccounts(t);
      const { mailroom, schema } = t;
      const seen: ConsumedEvent<{ account: string; cents: number }>[] = [];
      const attempts = new Map<string, number>();
      const consumer = mailroom.consumer({
        group: 'ledger',
        pollInterval: 20,
        retry: { maxAttempts: 3 },
        handlers: {
          [credited.type]: handleEvent(credited, async (event, ctx: ConsumerContext) => {
            await ctx.tx.query(`UPDATE "${schema}".accounts SET balance = balance + $2 WHERE id = $1`, [event.data.account, event.data.cents]);
            const n = (attempts.get(event.id) ?? 0) + 1;
            attempts.set(event.id, n);
            if (event.data.cents === 3 && n === 1) throw new RetryableError('failed after the write: it must roll back', { after: 10 });
            seen.push(event);
          }),
        },
      });
      await consumer.start();
      const relay = mailroom.relay({ pollInterval: 20 });
      await relay.start();
      const done = waitForEvents(consumer.worker, 'completed', 6);
      await mailroom.transaction(async (tx) => {
        for (const cents of [1, 2, 3]) await mailroom.publish(credited, { account: 'a', cents }, { tx, key: 'a', correlationId: 'req-1' });
      });
      await mailroom.publishMany(credited, [{ account: 'b', cents: 10 }, { account: 'b', cents: 20 }, { account: 'b', cents: 30 }], { key: 'b', causationId: 'cmd-9' });
      await done;
      assert.deepEqual(await balances(t), { a: 6, b: 60 });
      assert.deepEqual(seen.filter((e) => e.key === 'a').map((e) => e.data.cents), [1, 2, 3], 'per-key order, the retried event before the next');
      assert.deepEqual(seen.filter((e) => e.key === 'b').map((e) => e.data.cents), [10, 20, 30]);
      const a1 = seen.find((e) => e.key === 'a')!;
      assert.equal(a1.type, credited.type);
      assert.equal(a1.version, 2);
      assert.equal(a1.correlationId, 'req-1');
      assert.equal(seen.find((e) => e.key === 'b')?.causationId, 'cmd-9');
      assert.ok(a1.time instanceof Date);
      const inbox = await t.sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".inbox WHERE consumer_group = 'ledger'`);
      assert.equal(inbox[0]!.n, 6);
      const [job] = await t.sql<{ correlation_id: string; ordering_key: string; max_attempts: number }>(
        `SELECT correlation_id, ordering_key, max_attempts FROM "${schema}".jobs WHERE queue = 'consumer.ledger' AND payload->>'id' = $1`,
        [a1.id],
      );
      assert.deepEqual(job, { correlation_id: 'req-1', ordering_key: 'a', max_attempts: 3 });
      await relay.stop();
      await consumer.stop();
    });

    it('payloads are checked at consume: one that does not match the handler\'s definition is dead-lettered as validation, not retried; the handler gets the schema\'s output', async () => {
      const t = await db.open();
      const { mailroom } = t;
      const typedSeen: unknown[] = [];
      const plainSeen: unknown[] = [];
      const typed = mailroom.consumer({
        group: 'shipping',
        pollInterval: 20,
        retry: { maxAttempts: 5, backoff: { base: '1h' } },
        handlers: { [placedV1.type]: handleEvent(placedV1, (event) => void typedSeen.push(event.data)) },
      });
      // A handler not typed by handleEvent: the schema this process defined for the event's own version applies.
      const plain = mailroom.consumer({ group: 'audit', pollInterval: 20, handlers: { [placedV1.type]: (event) => void plainSeen.push(event.data) } });
      await Promise.all([typed.start(), plain.start()]);
      const relay = mailroom.relay({ pollInterval: 20 });
      await relay.start();
      const failed = waitForEvents(typed.worker, 'failed', 1);
      const typedDone = waitForEvents(typed.worker, 'completed', 1);
      const plainDone = waitForEvents(plain.worker, 'completed', 2);
      const { id: good } = await mailroom.publish(placedV1, { orderId: 'o-1' });
      const { id: breaking } = await mailroom.publish(placedV2, { orderId: 7 }); // a breaking change under the same type
      const [failures] = await Promise.all([failed, typedDone, plainDone]);
      const failure = failures[0]?.[1];
      await relay.stop();
      await Promise.all([typed.stop(), plain.stop()]);
      assert.deepEqual(typedSeen, [{ orderId: 'o-1', total: 0 }], 'the schema\'s output (its default applied), and only the matching event');
      assert.deepEqual(failure && [failure.category, failure.dead], ['validation', true]);
      const letters = await mailroom.deadLetters.list({ queue: 'consumer.shipping' });
      assert.equal(letters.items.length, 1);
      const letter = letters.items[0]!;
      assert.equal(letter.category, 'validation');
      assert.equal(letter.attempts, 1, 'not retried');
      assert.match(letter.message ?? '', new RegExp(`^consumer shipping: event ${breaking} \\(consumer\\.order-placed v2\\) against consumer\\.order-placed v1's schema: invalid payload: data\\.orderId: `));
      assert.deepEqual(
        plainSeen.sort((a, b) => String((a as { orderId: unknown }).orderId).localeCompare(String((b as { orderId: unknown }).orderId))),
        [{ orderId: 7 }, { orderId: 'o-1', total: 0 }],
        'each as its own version was published (v1 with its default applied at publish)',
      );
      assert.ok(good);
    });

    it('cancel() from an event handler means handled with nothing to do: the event is acknowledged and its inbox key kept', async () => {
      const t = await db.open();
      const { mailroom } = t;
      const consumer = mailroom.consumer({ group: 'skipper', pollInterval: 20, handlers: { [other.type]: () => cancel('not for this tenant') } });
      await consumer.start();
      const relay = mailroom.relay({ pollInterval: 20 });
      await relay.start();
      const done = waitForEvents(consumer.worker, 'completed', 1);
      const { id } = await mailroom.publish(other, { n: 1 });
      await done;
      await relay.stop();
      await consumer.stop();
      const keys = await t.sql<{ event_id: string }>(`SELECT event_id::text AS event_id FROM "${t.schema}".inbox WHERE consumer_group = 'skipper'`);
      assert.deepEqual(keys.map((k) => k.event_id), [id]);
    });

    it('an event published by a mailroom under the handler\'s own type and version is not checked again: a schema with transforms runs once, at publish', async () => {
      const t = await db.open();
      const seen: unknown[] = [];
      const consumer = t.mailroom.consumer({ group: 'payments', pollInterval: 20, handlers: { [paid.type]: handleEvent(paid, (event) => void seen.push(event.data)) } });
      await consumer.start();
      const relay = t.mailroom.relay({ pollInterval: 20 });
      await relay.start();
      const done = waitForEvents(consumer.worker, 'completed', 1);
      await t.mailroom.publish(paid, { amount: '12' });
      await done;
      await relay.stop();
      await consumer.stop();
      assert.deepEqual(seen, [{ amount: 12 }], "the schema's output as publish stored it, not refused as input a second time");
    });

    it('the group\'s retry policy applies to its events: backoff and attempts, its classifier, its timeout', async () => {
      const t = await db.open();
      const { mailroom, schema } = t;
      const runs: { n: number; at: number }[] = [];
      const consumer = mailroom.consumer({
        group: 'policy',
        pollInterval: 20,
        concurrency: 4,
        retry: { maxAttempts: 3, backoff: { base: 150, max: 150, jitter: 'none' } },
        // Long enough that a loaded machine does not time out n = 1 and n = 2 (their attempt, the inbox
        // look-up included, is one round trip); n = 3 waits for it.
        timeout: 400,
        // Anything saying "refused" is not worth retrying; everything else as the core decides.
        classify: (error) => (error instanceof Error && error.message.includes('refused') ? { category: 'permanent', retry: false } : defaultClassifier(error)),
        handlers: {
          [other.type]: handleEvent(other, async (event, ctx) => {
            runs.push({ n: event.data.n, at: Date.now() });
            if (event.data.n === 1) throw new Error('flaky, every time');
            if (event.data.n === 2) throw new Error('refused by the provider');
            await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve(), { once: true })); // n = 3: hangs until the timeout aborts it
            throw ctx.signal.reason;
          }),
        },
      });
      await consumer.start();
      const relay = mailroom.relay({ pollInterval: 20 });
      await relay.start();
      const dead = waitForEvents(consumer.worker, 'failed', 7, 20_000); // 3 + 1 + 3 attempts
      await mailroom.publishMany(other, [{ n: 1 }, { n: 2 }, { n: 3 }]);
      const failures = await dead;
      await relay.stop();
      await consumer.stop();
      const rows = await t.sql<{ n: number; state: string; attempt: number; dead_reason: string; category: string }>(
        `SELECT (payload->'data'->>'n')::int AS n, state, attempt, dead_reason, last_error->>'category' AS category
           FROM "${schema}".jobs WHERE queue = 'consumer.policy' ORDER BY 1`,
      );
      assert.deepEqual(rows, [
        { n: 1, state: 'dead', attempt: 3, dead_reason: 'max-attempts', category: 'transient' },
        { n: 2, state: 'dead', attempt: 1, dead_reason: 'permanent', category: 'permanent' },
        { n: 3, state: 'dead', attempt: 3, dead_reason: 'max-attempts', category: 'timeout' },
      ]);
      const flaky = runs.filter((r) => r.n === 1).map((r) => r.at);
      assert.equal(flaky.length, 3);
      for (let i = 1; i < flaky.length; i++) assert.ok(flaky[i]! - flaky[i - 1]! >= 140, `retry ${i} came ${flaky[i]! - flaky[i - 1]!} ms after the previous run; the group's backoff is 150 ms`);
      assert.equal(failures.filter(([, detail]) => detail.dead).length, 3);
    });

    it('a redelivered event (replayed outbox rows) takes effect once, skips the handler and moves the duplicate counter', async () => {
      const t = await db.open();
      await withAccounts(t);
      const { mailroom, schema } = t;
      let calls = 0;
      const consumer = mailroom.consumer({
        group: 'ledger',
        pollInterval: 20,
        handlers: {
          [credited.type]: handleEvent(credited, async (event, ctx) => {
            calls++;
            await ctx.tx.query(`UPDATE "${schema}".accounts SET balance = balance + $2 WHERE id = $1`, [event.data.account, event.data.cents]);
          }),
        },
      });
      await consumer.start();
      const relay = mailroom.relay();
      const first = waitForEvents(consumer.worker, 'completed', 3);
      for (const cents of [1, 2, 4]) await mailroom.publish(credited, { account: 'a', cents }, { key: 'a' });
      await flushUntil(relay, 3);
      await first;
      assert.deepEqual(await balances(t), { a: 7, b: 0 });
      // Replay every outbox row after the jobs were pruned (or lost): the fan-out makes new jobs, the inbox refuses them.
      await t.sql(`DELETE FROM "${schema}".jobs WHERE queue = 'consumer.ledger'`);
      await t.sql(`UPDATE "${schema}".relay_cursors SET cursor_xid = '0', cursor_position = 0 WHERE target = 'internal'`);
      const duplicates = new Promise<string[]>((resolve) => {
        const ids: string[] = [];
        consumer.on('duplicate', (e) => ids.push(e.id) === 3 && resolve(ids));
      });
      const again = waitForEvents(consumer.worker, 'completed', 3);
      await flushUntil(relay, 3);
      await again;
      assert.equal((await duplicates).length, 3);
      assert.deepEqual(await balances(t), { a: 7, b: 0 }, 'one effect per event');
      assert.equal(calls, 3, 'the handler did not run for the duplicates');
      assert.equal((await mailroom.stats()).consumers.ledger?.duplicatesRejected, 3);
      await relay.stop();
      await consumer.stop();
    });

    it('a new group starts at "now" by default, or from the earliest retained event', async () => {
      const t = await db.open();
      const { mailroom } = t;
      const relay = mailroom.relay();
      await mailroom.publish(other, { n: 1 });
      await flushUntil(relay, 1); // delivered before either group existed
      await mailroom.publish(other, { n: 2 }); // committed before either group existed, not yet relayed
      const got = { now: [] as number[], earliest: [] as number[] };
      const make = (group: 'now' | 'earliest') =>
        mailroom.consumer({ group, from: group, pollInterval: 20, handlers: { [other.type]: handleEvent(other, (e) => void got[group].push(e.data.n)) } });
      const fromNow = make('now');
      const fromEarliest = make('earliest');
      const nowDone = waitForEvents(fromNow.worker, 'completed', 1);
      const earliestDone = waitForEvents(fromEarliest.worker, 'completed', 3); // the backfilled event may run at once
      await fromNow.start();
      await fromEarliest.start();
      await mailroom.publish(other, { n: 3 });
      await flushUntil(relay, 2);
      await Promise.all([nowDone, earliestDone]);
      assert.deepEqual(got.now, [3]);
      assert.deepEqual(got.earliest.sort(), [1, 2, 3], 'no key: no order between them');
      await Promise.all([fromNow.stop(), fromEarliest.stop(), relay.stop()]);
      // Restarting an existing group does not backfill again.
      const restarted = make('earliest');
      await restarted.start();
      await restarted.stop();
      const counted = await t.sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${t.schema}".jobs WHERE queue = 'consumer.earliest'`);
      assert.equal(counted[0]?.n, 3);
    });

    it('refuses an inbox retention shorter than the retry horizon, naming both numbers; prunes expired inbox keys', async () => {
      const t = await db.open();
      const { mailroom } = t;
      const short = mailroom.consumer({ group: 'short', inboxRetention: '1h', retry: { maxAge: '2h' }, handlers: { [other.type]: () => {} } });
      await assert.rejects(short.start(), (e: unknown) =>
        e instanceof ValidationError && /inboxRetention \(3600000 ms\) is shorter than the group's retry horizon \(7200000 ms/.test(e.message),
      );
      const defaults = mailroom.consumer({ group: 'short', inboxRetention: '1h', handlers: { [other.type]: () => {} } });
      await assert.rejects(defaults.start(), /inboxRetention \(3600000 ms\) is shorter than the group's retry horizon .*25 attempts, backoff up to 3600000 ms/);
      assert.deepEqual(await t.sql(`SELECT name FROM "${t.schema}".consumer_groups`), [], 'nothing registered');
      assert.throws(() => mailroom.consumer({ group: 'Bad Group', handlers: { [other.type]: () => {} } }), /group "Bad Group" is not valid/);
      assert.throws(() => mailroom.consumer({ group: 'g', handlers: { 'NotAType': () => {} } }), /event type "NotAType" is not valid/);
      assert.throws(() => mailroom.consumer({ group: 'g', handlers: {} }), /handlers is empty/);
      assert.throws(() => mailroom.consumer({ group: 'g', from: 'latest' as never, handlers: { [other.type]: () => {} } }), /from must be 'now' or 'earliest'/);

      const ok = mailroom.consumer({ group: 'kept', inboxRetention: '2h', retry: { maxAge: '2h' }, maintenance: false, handlers: { [other.type]: () => {} } });
      await ok.start();
      const done = waitForEvents(ok.worker, 'completed', 2);
      await mailroom.publishMany(other, [{ n: 1 }, { n: 2 }]);
      await flushUntil(mailroom.relay(), 2);
      await done;
      await t.sql(`UPDATE "${t.schema}".inbox SET received_at = now() - interval '3 hours' WHERE event_id = (SELECT event_id FROM "${t.schema}".inbox ORDER BY event_id LIMIT 1)`);
      assert.deepEqual(await ok.prune(), { keys: 1 });
      assert.equal((await t.sql(`SELECT 1 FROM "${t.schema}".inbox`)).length, 1);
      await ok.stop();
    });

    it('stats: a group\'s lag counts events not yet fanned out and jobs not yet finished', async () => {
      const t = await db.open();
      const { mailroom } = t;
      const consumer = mailroom.consumer({ group: 'slow', handlers: { [other.type]: () => {} } });
      await consumer.start();
      await consumer.stop();
      await mailroom.publishMany(other, [{ n: 1 }, { n: 2 }, { n: 3 }]);
      let stats = await mailroom.stats();
      assert.deepEqual(stats.consumers.slow, { source: null, lag: 3, unrelayed: 3, unfinished: 0, dead: 0, duplicatesRejected: 0 });
      assert.equal(stats.relay.internal?.unpublished, 3);
      await flushUntil(mailroom.relay(), 3);
      stats = await mailroom.stats();
      assert.deepEqual(stats.consumers.slow, { source: null, lag: 3, unrelayed: 0, unfinished: 3, dead: 0, duplicatesRejected: 0 });
      assert.deepEqual(stats.relay.internal && { unpublished: stats.relay.internal.unpublished, heldBackBy: stats.relay.internal.heldBackBy }, { unpublished: 0, heldBackBy: null });
      assert.equal(stats.queues['consumer.slow']?.available, 3);
    });

    it('a handler can call ctx.step before and after its ctx.tx work (on the embedded database too, where ctx.tx holds the only connection)', async () => {
      const t = await db.open();
      await withAccounts(t);
      const consumer = t.mailroom.consumer({
        group: 'stepper',
        pollInterval: 20,
        handlers: {
          [credited.type]: handleEvent(credited, async (event, ctx: ConsumerContext) => {
            const receipt = await ctx.step('charge', async () => `charged ${event.data.cents}`);
            assert.equal(receipt, `charged ${event.data.cents}`);
            await ctx.tx.query(`UPDATE "${t.schema}".accounts SET balance = balance + $2 WHERE id = $1`, [event.data.account, event.data.cents]);
          }),
        },
      });
      await consumer.start();
      const done = waitForEvents(consumer.worker, 'completed', 1, 10_000);
      await t.mailroom.publish(credited, { account: 'a', cents: 3 });
      await flushUntil(t.mailroom.relay(), 1);
      await done;
      assert.deepEqual(await balances(t), { a: 3, b: 0 });
      await consumer.stop();
    });

    /**
     * A handler that snoozes its first run (after a ctx.tx statement when `readFirst`: that
     * statement records the inbox key, which the snooze must take back) and credits on the
     * second: the second run is not taken for a duplicate and takes effect once.
     */
    async function snoozesOnce(group: string, account: 'a' | 'b', cents: number, readFirst: boolean): Promise<void> {
      const t = await db.open();
      await withAccounts(t);
      let runs = 0;
      const consumer = t.mailroom.consumer({
        group,
        pollInterval: 20,
        handlers: {
          [credited.type]: handleEvent(credited, async (event, ctx: ConsumerContext) => {
            runs++;
            if (readFirst) await ctx.tx.query(`SELECT balance FROM "${t.schema}".accounts WHERE id = $1`, [event.data.account]);
            if (runs === 1) return snooze(30);
            await ctx.tx.query(`UPDATE "${t.schema}".accounts SET balance = balance + $2 WHERE id = $1`, [event.data.account, event.data.cents]);
          }),
        },
      });
      await consumer.start();
      const done = waitForEvents(consumer.worker, 'completed', 1);
      await t.mailroom.publish(credited, { account, cents });
      await flushUntil(t.mailroom.relay(), 1);
      await done;
      assert.equal(runs, 2, 'the snoozed event ran again');
      assert.deepEqual(await balances(t), { a: 0, b: 0, [account]: cents });
      assert.equal((await t.mailroom.stats()).consumers[group]?.duplicatesRejected, 0);
      await consumer.stop();
    }

    it('a snoozed event is not marked handled: it runs again and takes effect once', async () => {
      await snoozesOnce('snoozer', 'a', 5, false);
    });

    it('a handler that opened ctx.tx and then snoozes leaves no inbox key: the next run is not taken for a duplicate', async () => {
      await snoozesOnce('late-snoozer', 'b', 9, true);
    });

    it('two deliveries of one event at once: the second\'s first ctx.tx statement waits on the first\'s inbox key, then finds it; one effect', async () => {
      const t = await db.open();
      await withAccounts(t);
      let pastFirstStatement = 0;
      const consumer = t.mailroom.consumer({
        group: 'racer',
        concurrency: 2,
        pollInterval: 20,
        handlers: {
          [credited.type]: handleEvent(credited, async (event, ctx: ConsumerContext) => {
            await ctx.tx.query(`UPDATE "${t.schema}".accounts SET balance = balance + $2 WHERE id = $1`, [event.data.account, event.data.cents]);
            pastFirstStatement++;
            await new Promise((r) => setTimeout(r, 200)); // holds its uncommitted inbox key meanwhile
          }),
        },
      });
      await consumer.start();
      const done = waitForEvents(consumer.worker, 'completed', 2);
      const duplicate = new Promise((resolve) => consumer.once('duplicate', resolve));
      await t.mailroom.publish(credited, { account: 'b', cents: 7 });
      await flushUntil(t.mailroom.relay(), 1);
      // A second job carrying the same event (a delivery from elsewhere), next to the fanned-out one.
      await t.sql(
        `INSERT INTO "${t.schema}".jobs (id, queue, type, state, max_attempts, payload)
         SELECT gen_random_uuid(), queue, type, 'available', max_attempts, payload FROM "${t.schema}".jobs WHERE queue = 'consumer.racer'`,
      );
      await done;
      await duplicate;
      assert.equal(pastFirstStatement, 1, 'only one delivery got past its first ctx.tx statement');
      assert.deepEqual(await balances(t), { a: 0, b: 7 });
      assert.equal((await t.mailroom.stats()).consumers.racer?.duplicatesRejected, 1);
      await consumer.stop();
    });

    it('a handler that never opens ctx.tx: its inbox key commits with the batched completion; a later delivery skips it; a stale attempt records no key', async () => {
      const t = await db.open();
      const { mailroom, schema } = t;
      const handled: number[] = [];
      let hold: (() => void) | undefined;
      const held = new Promise<void>((resolve) => (hold = resolve));
      let reached: (() => void) | undefined;
      const reachedHold = new Promise<void>((resolve) => (reached = resolve));
      const consumer = mailroom.consumer({
        group: 'notifier',
        pollInterval: 20,
        concurrency: 10,
        handlers: {
          [other.type]: handleEvent(other, async (event) => {
            handled.push(event.data.n);
            if (event.data.n === 99) {
              reached!();
              await held;
            }
          }),
        },
      });
      await consumer.start();
      const done = waitForEvents(consumer.worker, 'completed', 20);
      await mailroom.publishMany(other, Array.from({ length: 20 }, (_, n) => ({ n })));
      const relay = mailroom.relay();
      await flushUntil(relay, 20);
      await done;
      const keys = await t.sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".inbox WHERE consumer_group = 'notifier'`);
      assert.equal(keys[0]!.n, 20, 'each completed event has its inbox key');
      const completed = await t.sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE queue = 'consumer.notifier' AND state = 'completed'`);
      assert.equal(completed[0]!.n, 20);

      // Redeliveries of three handled events (new jobs carrying them): found in the inbox, the handler does not run.
      const duplicates = waitForEvents(consumer.worker, 'completed', 3); // a duplicate's count commits with its completion
      await t.sql(
        `INSERT INTO "${schema}".jobs (id, queue, type, state, max_attempts, payload)
         SELECT gen_random_uuid(), queue, type, 'available', max_attempts, payload FROM "${schema}".jobs
          WHERE queue = 'consumer.notifier' AND (payload->'data'->>'n')::int < 3`,
      );
      await duplicates;
      assert.equal(handled.length, 20, 'no handler ran for a redelivery');
      assert.equal((await mailroom.stats()).consumers.notifier?.duplicatesRejected, 3);

      // An attempt that lost its job (claimed again meanwhile) completes nothing and records no key.
      const stale = waitForEvents(consumer.worker, 'stale', 1);
      await mailroom.publish(other, { n: 99 });
      await flushUntil(relay, 1);
      await reachedHold;
      await t.sql(`UPDATE "${schema}".jobs SET claim_count = claim_count + 1 WHERE queue = 'consumer.notifier' AND (payload->'data'->>'n')::int = 99`);
      hold!();
      await stale;
      const staleKey = await t.sql<{ n: number }>(
        `SELECT count(*)::int AS n FROM "${schema}".inbox AS i JOIN "${schema}".jobs AS j ON j.payload->>'id' = i.event_id::text
          WHERE i.consumer_group = 'notifier' AND (j.payload->'data'->>'n')::int = 99`,
      );
      assert.equal(staleKey[0]!.n, 0, 'no inbox key for the stale attempt');
      await consumer.stop();
    });

    itPlans(db, "the inbox lookup probes the group's keys by primary key, even on statistics taken while its inbox was small", async (t, session) => {
      const inbox = `"${t.schema}".inbox`;
      // Statistics taken with 10 keys, then 20,000 more: the planner believes the group has a handful.
      await session.query(`INSERT INTO ${inbox} (consumer_group, event_id) SELECT 'g', gen_random_uuid() FROM generate_series(1, 10)`);
      await session.query(`ANALYZE ${inbox}`);
      await session.query(`INSERT INTO ${inbox} (consumer_group, event_id) SELECT 'g', gen_random_uuid() FROM generate_series(1, 20000)`);
      const [known] = (await session.query<{ event_id: string }>(`SELECT event_id FROM ${inbox} LIMIT 1`)).rows;
      const asked = [known!.event_id, ...Array.from({ length: 49 }, () => crypto.randomUUID())];
      const { text } = consumerQueries(`"${t.schema}"`).inboxSeenAmong;
      const found = await session.query<{ event_id: string }>(text, ['g', asked]);
      assert.deepEqual(found.rows.map((r) => r.event_id), [known!.event_id], 'the lookup finds the key the inbox holds, and only it');
      for (const mode of PLAN_MODES) {
        const plan = await explainPrepared(session, mode, 'seen', text, `'g', '{${asked.join(',')}}'`);
        // Before: a hash join reading all 20,010 keys of the group through inbox_received_idx, per lookup.
        assert.doesNotMatch(plan, /inbox_received_idx|Hash/, `${mode}:\n${plan}`);
        assert.match(plan, /Index Only Scan using inbox_pkey on inbox i .*loops=50\)/, `${mode}: one primary-key probe per id asked:\n${plan}`);
      }
    });
  });
}
