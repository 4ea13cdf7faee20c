/**
 * The background pass that workers, consumer groups and relays run
 * (src/storage/periodic-pass.ts): one at a time, told to end when stopped,
 * waited for by `stop()`, and aborted once `stop(limitMs)` has waited that long.
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
    'test',
    10,
    async ({ stopped }) => {
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
    'test',
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

test('stop(limitMs) aborts the signal of a pass still running after limitMs, reports it by name, and resolves once the pass ended', async () => {
  const errors: unknown[] = [];
  let aborted: unknown;
  const pass = new PeriodicPass(
    'stuck chore',
    60_000,
    // A pass that ends only when its signal aborts (a statement cancelled on the server).
    ({ signal }) =>
      new Promise<void>((_, reject) => {
        signal.addEventListener('abort', () => {
          aborted = signal.reason;
          reject(signal.reason);
        });
      }),
    (error) => errors.push(error),
  );
  pass.start();
  pass.runNow();
  const began = Date.now();
  await pass.stop(1500);
  const waited = Date.now() - began;
  assert.ok(waited >= 1490 && waited < 3500, `stop(1500) resolved after ${waited} ms`);
  assert.ok(aborted instanceof Error, 'the signal was aborted with an error');
  assert.equal(errors.length, 1);
  assert.match((errors[0] as Error).message, /the stuck chore pass was cancelled: stop\(\) waited 1500 ms/);

  // A limit under a second still gives the pass a second: a batch that merely runs is not cut off.
  const short = new PeriodicPass(
    'short',
    60_000,
    ({ signal }) => new Promise<void>((resolve) => signal.addEventListener('abort', () => resolve())),
    () => {},
  );
  short.start();
  short.runNow();
  const shortBegan = Date.now();
  await short.stop(50);
  const shortWaited = Date.now() - shortBegan;
  assert.ok(shortWaited >= 990 && shortWaited < 3000, `stop(50) resolved after ${shortWaited} ms, not after a second`);

  // A pass that ends within the limit is not aborted.
  let signalOfQuickPass: AbortSignal | undefined;
  const quick = new PeriodicPass(
    'quick',
    60_000,
    async ({ signal }) => {
      signalOfQuickPass = signal;
      await sleep(20);
    },
    (error) => errors.push(error),
  );
  quick.start();
  quick.runNow();
  await quick.stop(1000);
  assert.equal(signalOfQuickPass?.aborted, false);
  assert.equal(errors.length, 1, 'nothing more reported');
});

test('start() after a stop that aborted a pass gives the next passes a signal not aborted', async () => {
  const signals: AbortSignal[] = [];
  const pass = new PeriodicPass(
    'chore',
    60_000,
    ({ signal }) => {
      signals.push(signal);
      return new Promise<void>((resolve) => signal.addEventListener('abort', () => resolve()));
    },
    () => {},
  );
  pass.start();
  pass.runNow();
  await pass.stop(20);
  assert.equal(signals[0]?.aborted, true);
  pass.start();
  pass.runNow();
  assert.equal(signals[1]?.aborted, false);
  await pass.stop(20);
  assert.equal(signals[1]?.aborted, true);
});
