/**
 * The reporter `npm test` runs beside TAP (test/helpers/failure-summary.mjs):
 * after the totals, one entry per test that failed or timed out, with its
 * file and line, the suites above it and the start of its error; nothing when
 * every test passed.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { it } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
/** `node --test` on one fixture with both reporters, as a run of its own (not a subtest of this file's run). */
function run(file: string, through: string[] = []) {
  const env = { ...process.env };
  delete env.NODE_TEST_CONTEXT;
  const args = [...through, '--test', '--test-reporter=tap', '--test-reporter-destination=stdout', '--test-reporter=./test/helpers/failure-summary.mjs', '--test-reporter-destination=stderr', file];
  return spawnSync(process.execPath, args, { cwd: ROOT, encoding: 'utf8', env });
}

it('lists each failed or timed-out test after the totals, with where it is and its error on one line', () => {
  const { status, stdout, stderr } = run('test/fixtures/failing-tests.fixture.mjs');
  assert.equal(status, 1);
  assert.match(stdout, /^# pass 2$/m, stdout);
  assert.equal(stderr.trim().split('\n').join('\n'), [
    'tests that failed or were cancelled (3):',
    '  test/fixtures/failing-tests.fixture.mjs:7  outer > inner > fails deep down',
    '    AssertionError: Expected values to be strictly equal: 1 !== 2',
    '  test/fixtures/failing-tests.fixture.mjs:11  throws a multi-line error',
    '    Error: first line second line',
    '  test/fixtures/failing-tests.fixture.mjs:14  runs past its timeout',
    '    test timed out after 50ms',
  ].join('\n'));
});

it('gives no line for a TypeScript file (node reports one of the code tsx compiled)', () => {
  const { status, stderr } = run('test/fixtures/failing-typescript.fixture.ts', ['--import', 'tsx']);
  assert.equal(status, 1);
  assert.equal(stderr.trim(), [
    'tests that failed or were cancelled (1):',
    '  test/fixtures/failing-typescript.fixture.ts  fails in TypeScript',
    '    AssertionError: Expected values to be strictly equal: 1 !== 2',
  ].join('\n'));
});

it('prints nothing when every test passed', () => {
  const { status, stderr } = run('test/fixtures/passing-tests.fixture.mjs');
  assert.equal(status, 0, stderr);
  assert.equal(stderr, '');
});
