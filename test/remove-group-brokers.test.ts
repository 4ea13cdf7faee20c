/**
 * Removing a consumer group together with what its broker keeps for it:
 * the RabbitMQ queue, the NATS durable consumer, the Redis stream group,
 * against each real broker (CI sets every URL).
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { defineEvent, MailroomError, ValidationError, type ConsumerSource } from '../src/index.ts';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { databaseUrl, testDatabases } from './helpers/databases.ts';
import { runJson, runMailroom, showRun } from './helpers/cli.ts';
import type { BrokerFixture } from './helpers/brokers/fixture.ts';
import { fixture as natsFixture } from './helpers/brokers/nats.ts';
import { fixture as rabbitmqFixture } from './helpers/brokers/rabbitmq.ts';
import { fixture as redisFixture } from './helpers/brokers/redis.ts';

const noted = defineEvent<{ n: number }>('removal.item-noted', { version: 1 });
const FIXTURES: readonly BrokerFixture[] = [rabbitmqFixture, natsFixture, redisFixture];
const db = testDatabases().find((d) => d.name === 'postgres') ?? testDatabases()[0]!;
let counter = 0;

/** What each broker keeps for a group once its consumer ran, in the adapter's words. */
const DELETED: Record<BrokerFixture['kind'], RegExp> = {
  rabbitmq: /^rabbitmq queue \S+ on .* deleted with 2 messages in it$/,
  nats: /^nats consumer \S+ on stream \S+ \(nats:\/\/.*\) deleted$/,
  redis: /^redis consumer group \S+ on redis redis:\/\/\S+ stream \S+ destroyed$/,
};

for (const fixture of FIXTURES) {
  describe(`removing a group with its ${fixture.kind} source`, { skip: !fixture.url && `set ${fixture.kind.toUpperCase()}_URL` }, () => {
    it('deletes what the broker keeps for the group, with the messages not taken yet; a second removal finds none; a running source refuses', async () => {
      const { mailroom } = await db.open();
      const pair = await fixture.pair(`rm${process.pid}-${Date.now().toString(36)}-${counter++}`);
      try {
        const handlers = { [noted.type]: async () => {} };
        const consumer = mailroom.consumer({ group: 'removal-g', source: pair.source(), pollInterval: 20, handlers });
        consumer.on('warning', () => {});
        await consumer.start(); // the queue, durable consumer or stream group now exists
        await consumer.stop();
        const running = pair.source();
        const other = mailroom.consumer({ group: 'removal-g', source: running, pollInterval: 20, handlers });
        other.on('warning', () => {});
        other.on('error', () => {});
        await other.start();
        try {
          await assert.rejects(mailroom.consumerGroups.remove('removal-g', { source: running }), (e: unknown) => {
            assert.ok(e instanceof MailroomError, String(e));
            assert.match(e.message, /the group left the database .* but deleting it on the broker failed: .*(running|stop)/);
            return true;
          });
        } finally {
          await other.stop();
        }

        const raw = await pair.raw();
        for (let n = 0; n < 2; n++) await raw.publish(JSON.stringify({ n }));
        await raw.close();
        assert.equal(await pair.pending(), 2, 'two messages wait for the group');

        const source = pair.source();
        const result = await mailroom.consumerGroups.remove('removal-g', { source });
        assert.equal(result.removed, false, 'the refused attempt above had already taken it out of the database');
        assert.match(result.broker ?? '', DELETED[fixture.kind]);
        const again = await mailroom.consumerGroups.remove('removal-g', { source: pair.source() });
        assert.match(again.broker ?? '', /none to delete/);
      } finally {
        await pair.cleanup();
      }
    });
  });
}

describe('removing a group with a source that cannot remove', () => {
  it('is refused before anything is done: ValidationError naming source, the group still registered', async () => {
    const { mailroom } = await db.open();
    const silent: ConsumerSource = { kind: 'custom', name: 'custom', start: async () => {}, stop: async () => {} };
    const consumer = mailroom.consumer({ group: 'kept-g', pollInterval: 20, handlers: { [noted.type]: async () => {} } });
    await consumer.start();
    await consumer.stop();
    await assert.rejects(
      mailroom.consumerGroups.remove('kept-g', { source: silent }),
      (e: unknown) => e instanceof ValidationError && e.issues[0]?.path === 'source' && /remove\(\) method/.test(e.message),
    );
    assert.equal((await mailroom.consumerGroups.remove('kept-g')).removed, true, 'it was still registered');
  });
});

describe('mailroom groups remove --broker (the real binary)', { skip: (!natsFixture.url || !databaseUrl) && 'set NATS_URL and TEST_DATABASE_URL' }, () => {
  it("deletes the NATS durable consumer of the config's consumer for the group; a group the config has no source for is a usage error", async () => {
    const t = await db.open();
    const pair = await natsFixture.pair(`rmcli${process.pid}-${Date.now().toString(36)}`);
    try {
      const consumer = t.mailroom.consumer({ group: 'cli-g', source: pair.source(), pollInterval: 20, handlers: { [noted.type]: async () => {} } });
      consumer.on('warning', () => {});
      await consumer.start();
      await consumer.stop();
      const { stream, durable } = pair.describe() as { stream: string; durable: string };
      const dir = mkdtempSync(join(tmpdir(), 'mailroom-groups-'));
      const config = join(dir, 'mailroom.config.mjs');
      const adapter = JSON.stringify(new URL('../dist/brokers/nats/index.js', import.meta.url).href);
      writeFileSync(
        config,
        `import { natsSource } from ${adapter};\n` +
          `export default { consumers: [{ group: 'cli-g', source: natsSource({ url: ${JSON.stringify(natsFixture.url)}, stream: ${JSON.stringify(stream)}, durable: ${JSON.stringify(durable)} }), handlers: { 'order.placed': async () => {} } }] };\n`,
      );
      const args = ['--config', config, '--database', databaseUrl!, '--schema', t.schema];
      const removed = await runMailroom(['groups', 'remove', 'cli-g', '--broker', '--json', ...args]);
      assert.equal(removed.code, 0, showRun(removed));
      const result = runJson<{ removed: boolean; broker: string }>(removed);
      assert.equal(result.removed, true);
      assert.match(result.broker, new RegExp(`^nats consumer ${durable} on stream ${stream} .* deleted$`));
      const other = await runMailroom(['groups', 'remove', 'billing', '--broker', ...args]);
      assert.equal(other.code, 2, showRun(other));
      assert.match(other.stderr, /has no consumer of group billing with a broker source/);
      assert.match(other.stderr, /its groups with a source: cli-g/);
    } finally {
      await pair.cleanup();
    }
  });
});
