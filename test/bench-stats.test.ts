/**
 * The benchmark's steady rate (bench/stats.ts steadyRate): completions arrive
 * in clumps (one per committed completion batch), and the rate must count the
 * completions between two clump ends, not cut a clump in two.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { steadyRate } from '../bench/stats.ts';

/** Completion instants: clump k of sizes[k] completions at k * spacingMs, spread over 0.2 ms. */
function clumps(sizes: readonly number[], spacingMs: number): Float64Array {
  const times: number[] = [];
  sizes.forEach((size, k) => {
    for (let i = 0; i < size; i++) times.push(k * spacingMs + (0.2 * i) / size);
  });
  return Float64Array.from(times);
}

/** A small deterministic generator (LCG), so the sizes are irregular but the test repeatable. */
function sizesBetween(lo: number, hi: number, count: number, seed: number): number[] {
  let x = seed;
  return Array.from({ length: count }, () => {
    x = (x * 1103515245 + 12345) % 2 ** 31;
    return lo + (x % (hi - lo + 1));
  });
}

describe('bench steadyRate', () => {
  it('gives the exact rate of evenly spaced clumps whatever completion the window starts and ends at', () => {
    const times = clumps(new Array(40).fill(700), 30);
    // 700 completions every 30 ms; indices 1,000 and 6,000 both fall inside a clump.
    const naive = (5000 / (times[6000]! - times[1000]!)) * 1000;
    const rate = steadyRate(times, 1000, 5000);
    assert.ok(Math.abs(rate.perSecond - 700 / 0.03) < 1e-6 * rate.perSecond, `rate ${rate.perSecond}, expected ${700 / 0.03}`);
    assert.equal(rate.completions % 700, 0, 'the window counts whole clumps');
    // The count of 5,000 between two instants inside clumps overstates it by 2%: what this estimator mends.
    assert.ok(naive > rate.perSecond * 1.015, `naive ${naive} against ${rate.perSecond}`);
  });

  it('counts exactly the completions between the two clump ends for clumps of irregular size', () => {
    const sizes = sizesBetween(550, 1000, 60, 7);
    const times = clumps(sizes, 25);
    const ends: number[] = [];
    sizes.reduce((sum, size) => (ends.push(sum + size - 1), sum + size), 0);
    for (const [skip, window] of [[1000, 5000], [1000, 10_000], [3333, 777]] as const) {
      const first = ends.findIndex((e) => e >= skip);
      const last = ends.findIndex((e) => e >= skip + window);
      const expected = ends[last]! - ends[first]!;
      const rate = steadyRate(times, skip, window);
      assert.equal(rate.completions, expected, `skip ${skip}, window ${window}`);
      assert.ok(Math.abs(rate.seconds - ((last - first) * 25) / 1000) < 1e-6, `seconds ${rate.seconds}`);
      assert.ok(Math.abs(rate.perSecond - expected / rate.seconds) < 1e-6);
    }
  });

  it('measures over the whole clump when the window ends inside the clump it starts in', () => {
    const times = clumps([100, 100, 100], 10);
    const rate = steadyRate(times, 120, 50);
    assert.equal(rate.completions, 100);
    assert.ok(Math.abs(rate.seconds - 0.01) < 1e-9);
  });

  it('clamps a window that runs past the last completion to the last completion', () => {
    const times = clumps([100, 100, 100], 10);
    const rate = steadyRate(times, 50, 10_000);
    assert.equal(rate.completions, 200);
    assert.ok(Math.abs(rate.perSecond - 10_000) < 1e-6);
  });

  it('refuses input it cannot measure a rate from, saying why', () => {
    assert.throws(() => steadyRate([], 0, 1), /no completion times; it needs at least 1/);
    assert.throws(() => steadyRate([1, 2, 3], 0, 0), /window 0; it must be at least 1/);
    assert.throws(() => steadyRate([1, 1.5, 2], 0, 1), /all 3 completions came in one clump \(no gap over 2 ms\) and no earlier start was given/);
  });

  it('measures a drain that completed in one clump from the instant the clock started', () => {
    const rate = steadyRate([10, 10.1, 10.2, 10.2], 0, 2, { startedAt: 2 });
    assert.equal(rate.completions, 4);
    assert.ok(Math.abs(rate.seconds - 0.0082) < 1e-12);
    assert.throws(() => steadyRate([10, 10.1], 0, 1, { startedAt: 10 }), /one clump/);
  });
});
