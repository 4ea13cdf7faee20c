/**
 * test/helpers/child-worker.ts, which the crash tests rely on to tell a worker's own crash from a
 * kill: real child processes that print a ready line and exit by themselves, or are killed.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import { killChildWorker, spawnChildWorker, type ChildWorker, type FixtureLine } from './helpers/child-worker.ts';

type Line = FixtureLine & { workerId?: string; n?: number };

describe('child worker processes of the crash tests', () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'mailroom-child-worker-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  /** A fixture that prints its config's lines, then exits with `code` or waits to be killed (code null). */
  const fixture = (name: string, code: number | null): string => {
    const path = join(dir, `${name}.mjs`);
    const end = code === null ? 'setInterval(() => {}, 1000);' : `setTimeout(() => process.exit(${code}), 50);`;
    writeFileSync(path, `for (const line of JSON.parse(process.argv[2]).lines) console.log(JSON.stringify(line));\nconsole.log('not json');\n${end}\n`);
    return path;
  };

  it('an exit of its own is reported with its code and not as a kill; its lines, id and ready time are kept', async () => {
    const registry = new Set<ChildWorker<Line>>();
    const exits: { killed: boolean; code: number | null; signal: string | null }[] = [];
    const child = spawnChildWorker<Line>(fixture('exits', 3), { lines: [{ event: 'ready', workerId: 'w-1' }, { event: 'step', n: 7 }] }, {
      cwd: dir,
      registry,
      onExit: (c, code, signal) => exits.push({ killed: c.killedByTest, code, signal }),
    });
    assert.equal(registry.size, 1);
    assert.equal(await child.ready, 'w-1');
    assert.equal(child.workerId, 'w-1');
    assert.ok(Number.isFinite(child.readyAt));
    assert.equal((await child.waitFor((l) => l.event === 'step', 5000, 'the step')).n, 7);
    await child.exited;
    assert.deepEqual(exits, [{ killed: false, code: 3, signal: null }]);
    assert.equal(registry.size, 0, 'an exited child leaves the registry');
    assert.deepEqual(child.lines.map((l) => l.event), ['ready', 'step'], 'a line that is not JSON is skipped');
    await assert.rejects(child.waitFor((l) => l.event === 'never', 50, 'a line that never comes'), /timed out after 50 ms waiting for a line that never comes/);
  });

  it('a kill by the test is marked as one, and a child that dies before it is ready rejects ready', async () => {
    const registry = new Set<ChildWorker<Line>>();
    const exits: { killed: boolean; signal: string | null }[] = [];
    const child = spawnChildWorker<Line>(fixture('waits', null), { lines: [] }, { cwd: dir, registry, stdin: 'pipe', onExit: (c, _code, signal) => exits.push({ killed: c.killedByTest, signal }) });
    await delay(200); // started, and printed nothing
    await killChildWorker(child);
    assert.deepEqual(exits, [{ killed: true, signal: 'SIGKILL' }]);
    await assert.rejects(child.ready, /exited before it was ready/);
    assert.equal(child.workerId, undefined);
  });
});
