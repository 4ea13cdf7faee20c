/**
 * `mailroom parked list|republish|discard`, run as the real binary against
 * events a relay target refused for good (parked by a real relay), on
 * PostgreSQL. Republishing goes through the target of that name in a config
 * file's relay.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { defineEvent, RefusedEventError, type ParkedEventRecord, type RelayTarget } from '../src/index.ts';
import { runJson, runMailroom, showRun } from './helpers/cli.ts';
import { databaseUrl, testDatabases, type TestMailroom } from './helpers/databases.ts';

const happened = defineEvent<{ n: number }>('cliparked.happened', { version: 1 });

describe('mailroom parked (real binary, PostgreSQL)', { skip: databaseUrl ? false : 'needs TEST_DATABASE_URL: the binary and the test open the database side by side' }, () => {
  let t: TestMailroom;
  let dir = '';
  let args: string[] = [];
  const ids = new Map<number, string>();

  before(async () => {
    t = await testDatabases().find((d) => d.name === 'postgres')!.open();
    dir = mkdtempSync(join(tmpdir(), 'mailroom-parked-'));
    args = ['--database', databaseUrl!, '--schema', t.schema];
    await t.mailroom.publishMany(happened, [1, 2, 3, 4].map((n) => ({ n })));
    // A target that refuses 2 and 3 for good: the relay parks them and delivers 1 and 4.
    const picky: RelayTarget = {
      name: 'picky',
      async publish(events) {
        for (const e of events) {
          const { n } = e.envelope.data as { n: number };
          ids.set(n, e.envelope.id);
          if (n === 2 || n === 3) throw new RefusedEventError(e.envelope.id, `n=${n} is too large for picky`);
        }
      },
    };
    const relay = t.mailroom.relay({ internal: false, to: [picky] });
    for (let i = 0; i < 100 && (await t.sql(`SELECT 1 FROM "${t.schema}".relay_parked`)).length < 2; i++) await relay.flush();
    await relay.stop();
    assert.equal((await t.sql(`SELECT 1 FROM "${t.schema}".relay_parked`)).length, 2);
  });

  after(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('list shows each parked event with its reason; discard deletes by id; republish publishes the rest through the config target of that name and unparks it', async () => {
    const listed = await runMailroom(['parked', 'list', ...args, '--json']);
    assert.equal(listed.code, 0, showRun(listed));
    const items = runJson<ParkedEventRecord[]>(listed);
    assert.deepEqual(
      items.map((p) => [p.target, p.eventId, p.type, p.reason]),
      [
        ['picky', ids.get(2), 'cliparked.happened', 'n=2 is too large for picky'],
        ['picky', ids.get(3), 'cliparked.happened', 'n=3 is too large for picky'],
      ],
    );
    const text = await runMailroom(['parked', 'list', 'picky', ...args]);
    assert.equal(text.code, 0, showRun(text));
    assert.match(text.stdout, /^\s*target\s+position\s+event id\s+type\s+bytes\s+parked\s+reason/m);
    assert.match(text.stdout, new RegExp(`^\\s*picky\\s+\\d+\\s+${ids.get(2)}\\s+cliparked\\.happened\\s+\\d+\\s+.+n=2 is too large for picky$`, 'm'));

    const discarded = await runMailroom(['parked', 'discard', 'picky', ids.get(3)!, ...args]);
    assert.equal(discarded.code, 0, showRun(discarded));
    assert.match(discarded.stdout, /^Discarded 1 parked event of picky\.$/m);

    // The config's relay has a target named picky that now takes everything: it writes what it gets to a file.
    const out = join(dir, 'published.jsonl');
    const config = join(dir, 'parked.config.mjs');
    writeFileSync(
      config,
      `import { appendFileSync } from 'node:fs';\n` +
        `export default { relay: { to: [{ name: 'picky', async publish(events) { for (const e of events) appendFileSync(${JSON.stringify(out)}, JSON.stringify(e.envelope.data) + '\\n'); } }] } };\n`,
    );
    const republished = await runMailroom(['parked', 'republish', 'picky', '--config', config, ...args]);
    assert.equal(republished.code, 0, showRun(republished));
    assert.match(republished.stdout, /^Republished 1 parked event to picky\.$/m);
    assert.deepEqual(readFileSync(out, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as unknown), [{ n: 2 }]);
    const none = await runMailroom(['parked', 'list', ...args]);
    assert.equal(none.code, 0, showRun(none));
    assert.equal(none.stdout, 'No parked events.\n');
  });

  it('usage mistakes exit 2 saying what to write; republish with no such target in the config names the ones it has', async () => {
    const cases: [string[], RegExp][] = [
      [['parked'], /expected a subcommand: list, republish, discard/],
      [['parked', 'park'], /unknown subcommand "park"/],
      [['parked', 'discard', 'picky'], /say which parked events of picky to delete: their event ids, or --all/],
      [['parked', 'discard', 'picky', 'x', '--all'], /give event ids or --all, not both/],
      [['parked', 'republish'], /expected the relay target's name/],
      [['parked', 'republish', 'picky', '--all'], /--all only applies to discard/],
      [['parked', 'list', '--limit', '0'], /--limit/],
    ];
    for (const [command, message] of cases) {
      const run = await runMailroom([...command, ...args]);
      assert.equal(run.code, 2, `${command.join(' ')}: ${showRun(run)}`);
      assert.match(run.stderr, message, command.join(' '));
    }
    const config = join(dir, 'other.config.mjs');
    writeFileSync(config, `export default { relay: { to: [{ name: 'audit', async publish() {} }] } };\n`);
    const missing = await runMailroom(['parked', 'republish', 'picky', '--config', config, ...args]);
    assert.equal(missing.code, 2, showRun(missing));
    assert.match(missing.stderr, /the relay of .*other\.config\.mjs has no target named "picky"/);
    assert.match(missing.stderr, /its targets: audit/);
    assert.ok(existsSync(config));
  });
});
