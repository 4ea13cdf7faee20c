/**
 * The shared broker adapter suite: the same tests against every broker on the
 * machine (RabbitMQ, NATS JetStream, Redis Streams), through the relay's
 * target and a consumer group's source, on PostgreSQL. Publish and consume
 * with every attribute intact; ack (nothing left pending); per-key order;
 * a duplicate publish takes effect once (job id, then inbox); a consumer
 * SIGKILLed after storing and before acking causes no second effect; the
 * broker restarted mid-stream loses nothing; invalid messages and unknown
 * types are dead-lettered, not redelivered forever.
 * A broker's tests are skipped only when its URL is unset; CI sets them all.
 */
import { before, describe, it, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { defineEvent, toEnvelope, type Consumer, type ConsumedEvent, type ConsumerContext, type IngestedInfo, type Relay } from '../src/index.ts';
import { DEFAULT_SOURCE_PREFETCH, type SourceMessage } from '../src/brokers/source.ts';
import { databaseUrl, testDatabases, type TestMailroom } from './helpers/databases.ts';
import { flushUntil } from './helpers/relay.ts';
import type { BrokerFixture, BrokerPair } from './helpers/brokers/fixture.ts';
import { fixture as natsFixture } from './helpers/brokers/nats.ts';
import { fixture as rabbitmqFixture } from './helpers/brokers/rabbitmq.ts';
import { fixture as redisFixture } from './helpers/brokers/redis.ts';
import type { BrokerConsumerConfig } from './fixtures/broker-consumer.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const CHILD = fileURLToPath(new URL('./fixtures/broker-consumer.ts', import.meta.url));
const noted = defineEvent<{ key: string; n: number }>('suite.item-noted', { version: 1 });
// Imported statically: describe blocks registered after a top-level await can leave the file hanging at its end.
const FIXTURES: readonly BrokerFixture[] = [rabbitmqFixture, natsFixture, redisFixture];
const postgres = testDatabases().find((d) => d.name === 'postgres');

interface Handled {
  event: ConsumedEvent<{ key: string; n: number }>;
}

interface Setup {
  t: TestMailroom;
  pair: BrokerPair;
  relay: Relay;
  relayErrors: unknown[];
  handled: Handled[];
  ingested: IngestedInfo[];
  startConsumer(): Promise<Consumer>;
  effects(): Promise<Map<string, number>>;
  waitForEffects(count: number, timeoutMs?: number): Promise<Map<string, number>>;
}

let counter = 0;

/** A test's setup; torn down right after the test (not at the end of the file: a root `after` waits for an empty event loop). */
async function setUp(tc: TestContext, fixture: BrokerFixture, options: { restartable?: boolean } = {}): Promise<Setup> {
  const t = await postgres!.open();
  await t.sql(`CREATE TABLE "${t.schema}".effects (seq bigserial PRIMARY KEY, event_id text NOT NULL)`);
  const pair = await fixture.pair(`s${process.pid}-${Date.now().toString(36)}-${counter++}`, options);
  const relay = t.mailroom.relay({ to: [pair.target()], internal: false, pollInterval: 20, batchSize: 50 });
  const relayErrors: unknown[] = [];
  const consumerErrors: unknown[] = [];
  relay.on('error', (e) => relayErrors.push(e));
  relay.on('warning', () => {});
  const handled: Handled[] = [];
  const ingested: IngestedInfo[] = [];
  const consumers: Consumer[] = [];
  const effects = async () => {
    const rows = await t.sql<{ event_id: string; n: number }>(`SELECT event_id, count(*)::int AS n FROM "${t.schema}".effects GROUP BY event_id`);
    return new Map(rows.map((r) => [r.event_id, r.n]));
  };
  const setup: Setup = {
    t,
    pair,
    relay,
    relayErrors,
    handled,
    ingested,
    async startConsumer() {
      const consumer = t.mailroom.consumer({
        group: 'suite',
        source: pair.source({ prefetch: 20 }),
        pollInterval: 20,
        concurrency: 8,
        handlers: {
          [noted.type]: async (event: ConsumedEvent<{ key: string; n: number }>, ctx: ConsumerContext) => {
            await ctx.tx.query(`INSERT INTO "${t.schema}".effects (event_id) VALUES ($1)`, [event.id]);
            handled.push({ event });
          },
        },
      });
      consumer.on('ingested', (info) => ingested.push(info));
      consumer.on('warning', () => {});
      consumer.on('error', (error) => consumerErrors.push(error)); // reconnects during a restart; shown when a wait times out
      consumers.push(consumer);
      await consumer.start();
      return consumer;
    },
    effects,
    async waitForEffects(count, timeoutMs = 30_000) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const seen = await effects();
        if (seen.size >= count) return seen;
        if (Date.now() > deadline) {
          const stats = await t.mailroom.stats();
          const jobs = await t.sql(`SELECT state, attempt, blocked, run_at, locked_by, locked_until, last_error FROM "${t.schema}".jobs WHERE queue = 'consumer.suite'`);
          const sessions = await t.sql(`SELECT state, wait_event_type, wait_event, left(query, 80) AS query FROM pg_stat_activity WHERE datname = current_database() AND state <> 'idle'`);
          throw new Error(
            `timed out with ${seen.size} of ${count} events handled; relay ${JSON.stringify(stats.relay)}, group ${JSON.stringify(stats.consumers.suite)}, ` +
              `jobs ${JSON.stringify(jobs)}, busy sessions ${JSON.stringify(sessions)}, relay errors: ${relayErrors.slice(-3).map(String).join(' | ')}, ` +
              `consumer errors: ${consumerErrors.slice(-3).map(String).join(' | ')}`,
          );
        }
        await new Promise((r) => setTimeout(r, 50));
      }
    },
  };
  tc.after(async () => {
    for (const c of consumers) await c.stop({ timeout: 2000 }).catch(() => {});
    await relay.stop().catch(() => {});
    await pair.cleanup().catch(() => {});
    // The file's tests share one pool of 20 connections (test/helpers/databases.ts): a mailroom left
    // open keeps its LISTEN connection, and fifteen of them starved the last broker's tests.
    await t.mailroom.close({ timeout: 1000 }).catch(() => {});
  });
  return setup;
}


async function publishSpread(t: TestMailroom, keys: number, perKey: number, options: { perTx?: number } = {}): Promise<string[]> {
  const items: { key: string; n: number }[] = [];
  for (let n = 0; n < perKey; n++) for (let k = 0; k < keys; k++) items.push({ key: `k${k}`, n });
  const perTx = options.perTx ?? items.length;
  const ids: string[] = [];
  for (let i = 0; i < items.length; i += perTx) {
    await t.mailroom.transaction(async (tx) => {
      for (const item of items.slice(i, i + perTx)) {
        const { id } = await t.mailroom.publish(noted, item, { tx, key: item.key, correlationId: `req-${item.key}`, traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' });
        ids.push(id);
      }
    });
  }
  return ids;
}

function assertPerKeyOrder(handled: readonly Handled[]): void {
  const last = new Map<string, number>();
  for (const { event } of handled) {
    const previous = last.get(event.data.key) ?? -1;
    assert.ok(event.data.n > previous, `key ${event.data.key}: ${event.data.n} handled after ${previous}`);
    last.set(event.data.key, event.data.n);
  }
}

for (const fixture of FIXTURES) {
  const kind = fixture.kind;
  const skip = !databaseUrl ? 'set TEST_DATABASE_URL' : fixture.url === null ? `set ${kind.toUpperCase()}_URL` : false;

  describe(`broker adapter suite: ${kind}`, { skip }, () => {
    before(() => assert.ok(postgres));

    it('publishes through the relay and consumes through a group with every attribute intact; acks leave nothing pending; per-key order holds', async (tc) => {
      const s = await setUp(tc, fixture);
      const consumer = await s.startConsumer();
      const ids = await publishSpread(s.t, 5, 12);
      await s.relay.start();
      const seen = await s.waitForEffects(ids.length);
      assert.deepEqual([...seen.values()].filter((n) => n !== 1), [], 'each event took effect once');
      assert.deepEqual([...seen.keys()].sort(), [...ids].sort());
      assertPerKeyOrder(s.handled);
      const one = s.handled.find((h) => h.event.id === ids[0])!.event;
      assert.equal(one.type, noted.type);
      assert.equal(one.key, 'k0');
      assert.deepEqual(one.data, { key: 'k0', n: 0 });
      assert.equal(one.correlationId, 'req-k0');
      assert.equal(one.traceparent, '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01');
      assert.equal(one.version, 1);
      await consumer.stop();
      assert.equal(await s.pair.pending(), 0, 'every message was acknowledged');
      const stats = await s.t.mailroom.stats();
      assert.equal(stats.relay[s.pair.target().name]?.unpublished, 0);
      assert.equal(stats.consumers.suite?.unfinished, 0);
    });

    it('a source left to its default delivers 250 messages and no more while none is acknowledged', async (tc) => {
      const s = await setUp(tc, fixture);
      const source = s.pair.source();
      const delivered: SourceMessage[] = [];
      const errors: unknown[] = [];
      await source.start((message) => void delivered.push(message), { group: 'suite', handlerTimeoutMs: null, report: (e) => errors.push(e), warn: () => {} });
      try {
        await s.t.mailroom.publishMany(noted, Array.from({ length: 300 }, (_, n) => ({ key: `k${n}`, n })));
        await flushUntil(s.relay, 300, s.pair.target().name);
        const deadline = Date.now() + 10_000;
        while (delivered.length < DEFAULT_SOURCE_PREFETCH && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
        await new Promise((r) => setTimeout(r, 500));
        assert.equal(delivered.length, DEFAULT_SOURCE_PREFETCH, `delivered ${delivered.length}; errors: ${errors.map(String).join(' | ')}`);
        assert.equal(DEFAULT_SOURCE_PREFETCH, 250);
      } finally {
        await source.stop();
      }
    });

    it('a duplicate publish takes effect once: a redelivery finds its job, a late one the inbox', async (tc) => {
      const s = await setUp(tc, fixture);
      const consumer = await s.startConsumer();
      const raw = await s.pair.raw();
      tc.after(() => raw.close()); // also when the test fails: an open client keeps the file from ending
      const envelope = toEnvelope({
        position: '1', xid: '1', id: '01936f8e-1f2a-7000-8000-00000000abcd', type: noted.type, version: 1, source: 'mailroom://suite', subject: 'k9',
        time: new Date(), correlation_id: null, causation_id: null, traceparent: null, headers: null, data: { key: 'k9', n: 1 },
      });
      const body = JSON.stringify(envelope);
      // Without a broker message id, so that no broker-side deduplication hides the duplicate.
      await raw.publish(body);
      await raw.publish(body);
      await s.waitForEffects(1);
      await new Promise((r) => setTimeout(r, 300));
      // A redelivery after the job was pruned by retention: only the inbox remembers the event.
      await s.t.sql(`DELETE FROM "${s.t.schema}".jobs WHERE queue = 'consumer.suite'`);
      const duplicate = new Promise((resolve) => consumer.once('duplicate', resolve));
      await raw.publish(body);
      await duplicate;
      await raw.close();
      assert.deepEqual([...(await s.effects()).values()], [1]);
      assert.ok(s.ingested.reduce((n, i) => n + i.duplicates, 0) >= 1, 'the second publish conflicted with the stored job');
      // The counter commits with the duplicate's completion, just after the event.
      const deadline = Date.now() + 5000;
      let rejected = 0;
      while (rejected < 1 && Date.now() < deadline) {
        rejected = (await s.t.mailroom.stats()).consumers.suite?.duplicatesRejected ?? 0;
        if (rejected < 1) await new Promise((r) => setTimeout(r, 20));
      }
      assert.equal(rejected, 1);
    });

    it('a consumer SIGKILLed after storing a batch (its jobs handed to its own worker) and before acking it causes no second effect', async (tc) => {
      const s = await setUp(tc, fixture);
      // The group's source exists before the events are published (sources start at 'now').
      const warm = await s.startConsumer();
      await warm.stop();
      const config: BrokerConsumerConfig = {
        kind, pair: s.pair.describe(), url: databaseUrl!, schema: s.t.schema, group: 'suite', type: noted.type, killAfterIngest: true,
      };
      const child = spawn(process.execPath, ['--import', 'tsx', CHILD, JSON.stringify(config)], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
      let output = '';
      child.stdout.on('data', (d: Buffer) => (output += d.toString()));
      child.stderr.on('data', (d: Buffer) => (output += d.toString()));
      const exited = new Promise<NodeJS.Signals | null>((resolve) => child.on('exit', (_code, sig) => resolve(sig)));
      // The events come once the child's consumer is running (its worker idle, so it takes a hand-off).
      const ready = Date.now();
      while (!output.includes('"ready"') && child.exitCode === null && Date.now() - ready < 30_000) await new Promise((r) => setTimeout(r, 20));
      const ids = await publishSpread(s.t, 3, 10);
      await s.relay.start();
      // A child that never kills itself is stopped (SIGTERM: a clean exit), and the test fails below rather than hanging.
      const limit = setTimeout(() => child.kill('SIGTERM'), 30_000);
      const signal = await exited.finally(() => clearTimeout(limit));
      assert.equal(signal, 'SIGKILL', `the child kills itself after a stored batch with jobs handed to its worker; its output:\n${output}`);
      const stored = output.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as { event: string; stored?: number; handed?: number }).filter((l) => l.event === 'ingested').at(-1);
      assert.ok(stored?.stored && stored.stored > 0, 'the child stored a batch before it died');
      assert.ok(stored.handed && stored.handed > 0, 'jobs of that batch were handed to the killed worker: they wait for their lease to run out');
      await s.startConsumer();
      const seen = await s.waitForEffects(ids.length, 45_000);
      await new Promise((r) => setTimeout(r, 500));
      const final = await s.effects();
      assert.equal(final.size, ids.length);
      assert.deepEqual([...final.values()].filter((n) => n !== 1), [], 'no event took effect twice');
      assert.ok(seen.size === ids.length);
      assert.ok(s.ingested.reduce((n, i) => n + i.duplicates, 0) >= 1, 'the broker redelivered what the dead consumer had stored and not acked');
    });

    it('the broker restarted mid-stream: the relay and the consumer recover, nothing is lost, nothing takes effect twice, per-key order holds', async (tc) => {
      const s = await setUp(tc, fixture, { restartable: true });
      await s.startConsumer();
      await s.relay.start();
      // Publish one event per key every 25 ms from before the restart until well after it, so the relay
      // has events to deliver while the broker is down.
      let restarted = false;
      const restarting = (async () => {
        await new Promise((r) => setTimeout(r, 300));
        await s.pair.restart();
        restarted = true;
      })();
      const ids: string[] = [];
      let after = 0;
      for (let n = 0; !restarted || after < 10; n++) {
        if (restarted) after++;
        await s.t.mailroom.transaction(async (tx) => {
          for (let k = 0; k < 4; k++) ids.push((await s.t.mailroom.publish(noted, { key: `k${k}`, n }, { tx, key: `k${k}` })).id);
        });
        await new Promise((r) => setTimeout(r, 25));
      }
      await restarting;
      const seen = await s.waitForEffects(ids.length, 60_000);
      await new Promise((r) => setTimeout(r, 500));
      assert.deepEqual([...(await s.effects()).values()].filter((n) => n !== 1), [], 'no event took effect twice');
      assert.equal(seen.size, ids.length, 'every committed event arrived');
      assert.ok(s.relayErrors.length > 0, 'the relay met the outage (its publishes failed while the broker was down)');
      assertPerKeyOrder(s.handled.filter((h, i, all) => all.findIndex((o) => o.event.id === h.event.id) === i));
    });

    it('a message that is not a CloudEvent and an event of a type no handler knows are dead-lettered, acked, and not redelivered', async (tc) => {
      const s = await setUp(tc, fixture);
      const consumer = await s.startConsumer();
      const raw = await s.pair.raw();
      tc.after(() => raw.close()); // also when the test fails: an open client keeps the file from ending
      await raw.publish('{ definitely not json', { messageId: 'bad-1' });
      await raw.publish(JSON.stringify({ specversion: '1.0', id: 'x-1', source: '/elsewhere', type: 'suite.unheard-of', data: {} }), { messageId: 'x-1' });
      const deadline = Date.now() + 20_000;
      let dead: { type: string; dead_reason: string }[] = [];
      while (dead.length < 2 && Date.now() < deadline) {
        dead = await s.t.sql(`SELECT type, dead_reason FROM "${s.t.schema}".jobs WHERE queue = 'consumer.suite' AND state = 'dead' ORDER BY dead_reason`);
        await new Promise((r) => setTimeout(r, 50));
      }
      await raw.close();
      assert.deepEqual(dead, [{ type: 'suite.unheard-of', dead_reason: 'unknown-type' }, { type: 'mailroom.invalid-message', dead_reason: 'validation' }]);
      await consumer.stop();
      assert.equal(await s.pair.pending(), 0, 'both were acknowledged');
    });
  });
}
