/**
 * Retiring a relay target no relay runs any more (`relayTargets.remove`, `mailroom targets remove`):
 * its cursor and parked events go, a target a relay holds and the internal target while groups of
 * internal events exist are refused, and bad names are refused.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { defineEvent, MailroomError, ValidationError, type RelayTarget } from '../src/index.ts';
import { databaseUrl, testDatabases, type TestMailroom } from './helpers/databases.ts';
import { flushUntil } from './helpers/relay.ts';
import { runMailroom } from './helpers/cli.ts';
import { eventually } from './helpers/events.ts';

const shipped = defineEvent<{ n: number }>('targets.order-shipped', { version: 1 });
const old: RelayTarget = { name: 'old-broker', publish: async () => {} };

async function cursors(t: TestMailroom): Promise<string[]> {
  return (await t.sql<{ target: string }>(`SELECT target FROM "${t.schema}".relay_cursors ORDER BY target`)).map((r) => r.target);
}

async function parkOne(t: TestMailroom, target: string): Promise<void> {
  await t.sql(
    `INSERT INTO "${t.schema}".relay_parked (target, position, xid, event_id, type, reason, body, holder) VALUES ($1, 1, '1', 'e1', 'targets.order-shipped', 'too large', '{}', 'test')`,
    [target],
  );
}

for (const db of testDatabases()) {
  describe(`removing a relay target on ${db.name}`, () => {
    it('removes the cursor and the parked events of a target no relay runs; a second removal finds nothing', async () => {
      const t = await db.open();
      const { mailroom } = t;
      const relay = mailroom.relay({ to: [old], internal: false });
      await mailroom.publish(shipped, { n: 1 });
      await flushUntil(relay, 1, old.name);
      await relay.stop();
      await parkOne(t, old.name);
      assert.deepEqual(await cursors(t), [old.name]);
      assert.deepEqual(await mailroom.relayTargets.remove(old.name), { removed: true, parked: 1 });
      assert.deepEqual(await cursors(t), []);
      const [parked] = await t.sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${t.schema}".relay_parked`);
      assert.equal(parked!.n, 0);
      assert.deepEqual(await mailroom.relayTargets.remove(old.name), { removed: false, parked: 0 });
    });

    it('is refused while a relay holds the target, and for the internal target while groups of internal events exist; bad names are refused', async () => {
      const t = await db.open();
      const { mailroom } = t;
      const relay = mailroom.relay({ to: [old], internal: false, pollInterval: 20 });
      await relay.start();
      try {
        await eventually(async () => (await t.sql<{ holder: string | null }>(`SELECT holder FROM "${t.schema}".relay_cursors WHERE target = $1`, [old.name]))[0]?.holder != null, 10_000, 'the relay holds its target');
        await assert.rejects(mailroom.relayTargets.remove(old.name), (e: unknown) => e instanceof MailroomError && /a relay \(.+\) runs target old-broker now; stop every relay that delivers to it/.test(e.message));
      } finally {
        await relay.stop();
      }
      assert.deepEqual(await cursors(t), [old.name], 'nothing removed while refused');
      const group = mailroom.consumer({ group: 'shipping', handlers: { [shipped.type]: () => {} } });
      await group.start();
      await group.stop();
      await assert.rejects(mailroom.relayTargets.remove('internal'), /the internal target feeds the consumer groups shipping; remove those groups first/);
      for (const bad of ['', 7, null]) await assert.rejects(mailroom.relayTargets.remove(bad as never), ValidationError);
      await mailroom.consumerGroups.remove('shipping');
      assert.equal((await mailroom.relayTargets.remove('internal')).removed, true, 'with no group left it goes');
    });
  });
}

describe('mailroom targets remove', () => {
  it('removes a target by name (exit 0), finds none the second time (exit 1), and refuses bad usage (exit 2)', { skip: databaseUrl ? false : 'TEST_DATABASE_URL is not set' }, async () => {
    const [postgres] = testDatabases().filter((d) => d.name === 'postgres');
    const t = await postgres!.open();
    const relay = t.mailroom.relay({ to: [old], internal: false });
    await t.mailroom.publish(shipped, { n: 1 });
    await flushUntil(relay, 1, old.name);
    await relay.stop();
    const args = ['--database', databaseUrl!, '--schema', t.schema];
    const removed = await runMailroom(['targets', 'remove', old.name, ...args, '--json']);
    assert.equal(removed.code, 0, removed.stderr);
    assert.deepEqual(JSON.parse(removed.stdout), { target: old.name, removed: true, parked: 0 });
    const again = await runMailroom(['targets', 'remove', old.name, ...args]);
    assert.equal(again.code, 1);
    assert.match(again.stderr, /no relay target named old-broker has a cursor/);
    const usage = await runMailroom(['targets', 'remove', ...args]);
    assert.equal(usage.code, 2);
    assert.match(usage.stderr, /expected the name of the target to remove/);
  });
});
