/**
 * The background pass that workers, consumer groups and relays run
 * (src/storage/periodic-pass.ts): one at a time, told to end when stopped,
 * and waited for by `stop()`.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { PeriodicPass } from '../src/storage/periodic-pass.ts';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

test('a pass runs every interval, never two at once; stop() waits for the one in flight, which sees stopped()', async () => {
  let started = 0;
  let running = 0;
  let most = 0;
  let sawStopped = false;
  let ended = false;
  const pass = new PeriodicPass(
    10,
    async (stopped) => {
      started++;
      most = Math.max(most, ++running);
      // A pass of 60 ms in batches of 5 ms: ticks every 10 ms fall while it runs.
      for (let i = 0; i < 12 && !stopped(); i++) await sleep(5);
      sawStopped = stopped();
      running--;
      ended = true;
    },
    (error) => assert.fail(`no error expected: ${String(error)}`),
  );
  pass.start();
  await sleep(25);
  assert.equal(started, 1, 'the ticks during the first pass started no second one');
  let stopResolved = false;
  const stopping = pass.stop().then(() => void (stopResolved = true));
  assert.equal(stopResolved, false);
  await stopping;
  assert.ok(ended && sawStopped, 'stop() resolved after the pass ended, and the pass saw stopped()');
  assert.equal(most, 1);
  const before = started;
  pass.runNow();
  await sleep(30);
  assert.equal(started, before, 'no pass after stop(), neither on a tick nor on runNow()');
});

test("a pass that fails is reported and the next tick runs again; start() after stop() runs passes again", async () => {
  const errors: unknown[] = [];
  let runs = 0;
  const pass = new PeriodicPass(
    5,
    async () => {
      runs++;
      throw new Error(`pass ${runs} failed`);
    },
    (error) => errors.push(error),
  );
  pass.start();
  while (runs < 2) await sleep(2);
  await pass.stop();
  assert.ok(errors.length >= 1 && errors.every((e) => e instanceof Error && /failed/.test(e.message)), `errors: ${errors.map(String).join('; ')}`);
  const stoppedAt = runs;
  pass.start();
  while (runs < stoppedAt + 1) await sleep(2);
  await pass.stop();
  assert.ok(runs > stoppedAt, 'start() after stop() runs passes again');
});
