/**
 * `consumerGroups.remove`: a group that no longer runs stops getting jobs from
 * the fan-out; its jobs nobody will run are cancelled and its inbox keys go;
 * its dead letters stay. Refused while a consumer of the group still runs.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { defineEvent, MailroomError, ValidationError } from '../src/index.ts';
import { runJson, runMailroom, showRun } from './helpers/cli.ts';
import { databaseUrl, testDatabases, type TestMailroom } from './helpers/databases.ts';
import { eventually, waitForEvents } from './helpers/events.ts';
import { flushUntil } from './helpers/relay.ts';

const billed = defineEvent<{ n: number }>('groups.billed', { version: 1 });

async function statesOf(t: TestMailroom, queue: string): Promise<Record<string, number>> {
  const rows = await t.sql<{ state: string; n: number }>(`SELECT state, count(*)::int AS n FROM "${t.schema}".jobs WHERE queue = $1 GROUP BY state ORDER BY state`, [queue]);
  return Object.fromEntries(rows.map((r) => [r.state, r.n]));
}

for (const db of testDatabases()) {
  describe(`removing a consumer group, on ${db.name}`, () => {
    it('the fan-out stops making its jobs; its waiting jobs and one left active under an expired lease are cancelled, its inbox keys deleted, its dead letters kept; another group is untouched', async () => {
      const t = await db.open();
      const { mailroom } = t;
      let failNext = true;
      const old = mailroom.consumer({
        group: 'billing-v1',
        pollInterval: 20,
        retry: { maxAttempts: 1 },
        handlers: {
          [billed.type]: () => {
            if (failNext) {
              failNext = false;
              throw new Error('down');
            }
          },
        },
      });
      const kept = mailroom.consumer({ group: 'ledger', pollInterval: 20, handlers: { [billed.type]: () => {} } });
      await old.start();
      await kept.start();
      const relay = mailroom.relay();
      // Three events handled by both groups (one dead-lettered in billing-v1), then the old group stops.
      const settled = Promise.all([waitForEvents(old.worker, 'completed', 2), waitForEvents(old.worker, 'failed', 1)]);
      await mailroom.publishMany(billed, [{ n: 1 }, { n: 2 }, { n: 3 }]);
      await flushUntil(relay, 3);
      await settled;
      await old.stop();
      // Two more reach billing-v1's queue, keyed (the second waits behind the first, blocked), and nobody runs them.
      await mailroom.publish(billed, { n: 4 }, { key: 'acct-1' });
      await mailroom.publish(billed, { n: 5 }, { key: 'acct-1' });
      await flushUntil(relay, 2);
      assert.deepEqual(await statesOf(t, 'consumer.billing-v1'), { available: 2, completed: 2, dead: 1 });
      // The key's first job was taken by a consumer that died with it: active, its lease expired.
      await t.sql(
        `UPDATE "${t.schema}".jobs SET state = 'active', attempt = attempt + 1, claim_count = claim_count + 1, locked_until = now() - interval '1 minute'
          WHERE queue = 'consumer.billing-v1' AND state = 'available' AND NOT blocked`,
      );
      assert.deepEqual(await statesOf(t, 'consumer.billing-v1'), { active: 1, available: 1, completed: 2, dead: 1 });
      const inbox = `SELECT count(*)::int AS n FROM "${t.schema}".inbox WHERE consumer_group = $1`;
      assert.equal((await t.sql<{ n: number }>(inbox, ['billing-v1']))[0]!.n, 2);

      assert.deepEqual(await mailroom.consumerGroups.remove('billing-v1'), { removed: true, cancelledJobs: 2, inboxKeys: 2, broker: null });
      assert.deepEqual(await statesOf(t, 'consumer.billing-v1'), { cancelled: 2, completed: 2, dead: 1 });
      assert.equal((await t.sql<{ n: number }>(inbox, ['billing-v1']))[0]!.n, 0);
      const stats = await mailroom.stats();
      assert.equal(stats.consumers['billing-v1'], undefined, 'no longer listed');
      assert.equal(stats.queues['consumer.billing-v1']?.dead, 1, 'its dead letter stays');
      // The fan-out makes no job for it any more; the other group still gets every event.
      await mailroom.publish(billed, { n: 6 });
      await flushUntil(relay, 1);
      assert.deepEqual(await statesOf(t, 'consumer.billing-v1'), { cancelled: 2, completed: 2, dead: 1 });
      await eventually(async () => (await statesOf(t, 'consumer.ledger')).completed === 6, 10_000, 'ledger handled all six events');
      assert.deepEqual(await mailroom.consumerGroups.remove('billing-v1'), { removed: false, cancelledJobs: 0, inboxKeys: 0, broker: null }, 'a second removal finds nothing');
      await relay.stop();
      await kept.stop();
    });

    it('refuses while a job of the group runs under a live lease, and a bad name with an error naming it', async () => {
      const t = await db.open();
      const { mailroom } = t;
      let release = () => {};
      const running = new Promise<void>((r) => (release = r));
      const consumer = mailroom.consumer({ group: 'busy', pollInterval: 20, handlers: { [billed.type]: () => running } });
      await consumer.start();
      const started = waitForEvents(consumer.worker, 'started', 1);
      await mailroom.publish(billed, { n: 1 });
      const relay = mailroom.relay();
      await flushUntil(relay, 1);
      await started;
      await assert.rejects(mailroom.consumerGroups.remove('busy'), (e: unknown) => e instanceof MailroomError && /group busy has 1 job\(s\) running under a live lease.*stop every consumer of the group/.test(e.message));
      assert.equal((await mailroom.stats()).consumers.busy?.unfinished, 1, 'nothing was removed');
      release();
      await consumer.stop();
      await relay.stop();
      assert.deepEqual(await mailroom.consumerGroups.remove('busy'), { removed: true, cancelledJobs: 0, inboxKeys: 1, broker: null });
      for (const bad of ['', 'Billing', 'a b', 'x'.repeat(65), 42]) {
        await assert.rejects(mailroom.consumerGroups.remove(bad as string), (e: unknown) => e instanceof ValidationError && /consumerGroups\.remove: group .* is not valid; use 1-64 lower-case letters/.test(e.message), String(bad));
      }
    });
  });
}

describe('mailroom groups remove (real binary, PostgreSQL)', { skip: databaseUrl ? false : 'needs TEST_DATABASE_URL: the binary and the test open the database side by side' }, () => {
  it('removes a group and says what it did; an unknown group exits 1; bad usage (a bad group name too) exits 2 with a hint', async () => {
    const t = await testDatabases().find((d) => d.name === 'postgres')!.open();
    const args = ['--database', databaseUrl!, '--schema', t.schema];
    const consumer = t.mailroom.consumer({ group: 'audit-v1', handlers: { [billed.type]: () => {} } });
    await consumer.start();
    await consumer.stop();
    await t.mailroom.publishMany(billed, [{ n: 1 }, { n: 2 }]);
    const relay = t.mailroom.relay();
    await flushUntil(relay, 2);
    await relay.stop();
    const removed = await runMailroom(['groups', 'remove', 'audit-v1', ...args]);
    assert.equal(removed.code, 0, showRun(removed));
    assert.match(removed.stdout, /^Removed consumer group audit-v1: 2 jobs cancelled, 0 inbox keys deleted\.$/m);
    assert.deepEqual(await statesOf(t, 'consumer.audit-v1'), { cancelled: 2 });
    const again = await runMailroom(['groups', 'remove', 'audit-v1', '--json', ...args]);
    assert.equal(again.code, 1, showRun(again));
    assert.deepEqual(runJson(again), { removed: false, cancelledJobs: 0, inboxKeys: 0, broker: null });
    const unknown = await runMailroom(['groups', 'remove', 'nobody', ...args]);
    assert.equal(unknown.code, 1, showRun(unknown));
    assert.match(unknown.stderr, /no consumer group named nobody is registered/);
    for (const bad of [['groups'], ['groups', 'drop', 'x'], ['groups', 'remove'], ['groups', 'remove', 'a', 'b'], ['groups', 'remove', 'Bad Name']]) {
      const run = await runMailroom([...bad, ...args]);
      assert.equal(run.code, 2, showRun(run));
      assert.match(run.stderr, /mailroom groups.*\n.*e\.g\. mailroom groups remove billing-v1/s, showRun(run));
    }
  });
});
