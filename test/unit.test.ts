/**
 * Pure units, no database: durations, backoff, the default classifier,
 * snooze, UUIDv7 ids, identifier validation, payload serialisation, the
 * retry decision a worker makes after a failed attempt, and the batching of
 * completions and look-ups (with a stand-in for the statement they send).
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { z } from 'zod';
import * as zm from 'zod/mini';
import { toMilliseconds } from '../src/duration.ts';
import { defineEvent, defineJob, fromEnvelope, PermanentError, RateLimitedError, RetryableError, snooze, isSnooze, ValidationError } from '../src/index.ts';
import { checkedEvent } from '../src/consumers/check-payload.ts';
import { assertName, quoteSchema } from '../src/identifiers.ts';
import { isUuid, newId } from '../src/ids.ts';
import { DEFAULT_MAX_PAYLOAD_BYTES, serializePayload } from '../src/payload.ts';
import { backoffDelay, DEFAULT_MAX_ATTEMPTS, resolveRetryPolicy, type RetryOptions } from '../src/retry/backoff.ts';
import { retryHorizonMs } from '../src/retention.ts';
import { defaultClassifier, JobTimeoutError, UnknownJobTypeError } from '../src/retry/classify.ts';
import { decideFailure } from '../src/worker/execute.ts';
import { SerialLane } from '../src/worker/serial-lane.ts';
import { Waker } from '../src/worker/waker.ts';
import { Signal } from '../src/worker/signal.ts';
import { CoalescingBatch } from '../src/storage/coalescing-batch.ts';
import { isConcurrencyConflict } from '../src/storage/conflicts.ts';
import { Completer } from '../src/worker/completer.ts';
import { runNamed, type Driver, type NamedQuery, type QueryResult } from '../src/storage/driver.ts';
import { planBatch } from '../src/relay/read-batch.ts';
import { knownCursorStillHeld } from '../src/relay/known-cursor.ts';
import { relayQueries } from '../src/relay/relay-queries.ts';
import type { JobQueries } from '../src/jobs/queries.ts';
import type { ClaimedRow } from '../src/worker/types.ts';

/** Asserts `fn` throws a ValidationError whose message matches every pattern. */
function throwsValidation(fn: () => unknown, ...patterns: RegExp[]): void {
  assert.throws(fn, (error: unknown) => {
    assert.ok(error instanceof ValidationError, `expected a ValidationError, got ${String(error)}`);
    for (const p of patterns) assert.match(error.message, p);
    return true;
  });
}

const policy = (retry?: RetryOptions) => resolveRetryPolicy(retry, 'test');

describe('durations', () => {
  test('numbers are milliseconds; strings take ms, s, m, h and d', () => {
    assert.equal(toMilliseconds(0, 'x'), 0);
    assert.equal(toMilliseconds(250, 'x'), 250);
    assert.equal(toMilliseconds('500ms', 'x'), 500);
    assert.equal(toMilliseconds('30s', 'x'), 30_000);
    assert.equal(toMilliseconds('10m', 'x'), 600_000);
    assert.equal(toMilliseconds('2h', 'x'), 7_200_000);
    assert.equal(toMilliseconds('1d', 'x'), 86_400_000);
    assert.equal(toMilliseconds('1.5s', 'x'), 1500);
    assert.equal(toMilliseconds(' 2s ', 'x'), 2000, 'surrounding spaces are ignored');
    assert.equal(toMilliseconds('2 s', 'x'), 2000, 'a space before the unit is allowed');
    assert.equal(toMilliseconds(1.4, 'x'), 1, 'fractions of a millisecond are rounded');
    assert.equal(toMilliseconds('0s', 'x'), 0);
  });

  test('negative, non-finite and unknown durations are refused, naming what was wrong and where', () => {
    throwsValidation(() => toMilliseconds(-1, 'delay'), /^delay:/, /0 or more/, /-1/);
    throwsValidation(() => toMilliseconds(Number.NaN, 'delay'), /^delay:/, /finite/);
    throwsValidation(() => toMilliseconds(Number.POSITIVE_INFINITY, 'delay'), /^delay:/, /finite/);
    for (const bad of ['-5s', 'soon', '5', '', '5w', '1e3s', 's', '5 seconds', '5S']) {
      throwsValidation(() => toMilliseconds(bad, 'retry.backoff.base'), /^retry\.backoff\.base:/, /not a duration/, /'30s'/);
    }
  });

  test('a ValidationError lists the field it concerns', () => {
    try {
      toMilliseconds('soon', 'timeout');
      assert.fail('should have thrown');
    } catch (error) {
      assert.ok(error instanceof ValidationError);
      assert.deepEqual(error.issues.map((i) => i.path), ['timeout']);
    }
  });
});

describe('backoff', () => {
  test('defaults: 25 attempts, base 1s, max 1h, multiplier 2, full jitter, no max age', () => {
    assert.deepEqual(policy(), { maxAttempts: DEFAULT_MAX_ATTEMPTS, maxAgeMs: null, baseMs: 1000, maxMs: 3_600_000, multiplier: 2, jitter: 'full' });
    assert.equal(DEFAULT_MAX_ATTEMPTS, 25);
    assert.equal(policy({ maxAge: '1d' }).maxAgeMs, 86_400_000);
  });

  test('without jitter the delay grows exponentially from base and stops at max', () => {
    const p = policy({ backoff: { base: '1s', max: '10s', jitter: 'none' } });
    assert.deepEqual(
      [1, 2, 3, 4, 5, 6, 10].map((attempt) => backoffDelay(p, attempt)),
      [1000, 2000, 4000, 8000, 10_000, 10_000, 10_000],
    );
  });

  test('the multiplier sets the growth; 1 keeps the delay constant', () => {
    const triple = policy({ backoff: { base: 100, max: '1h', multiplier: 3, jitter: 'none' } });
    assert.deepEqual([1, 2, 3, 4].map((a) => backoffDelay(triple, a)), [100, 300, 900, 2700]);
    const flat = policy({ backoff: { base: '5s', max: '5s', multiplier: 1, jitter: 'none' } });
    assert.deepEqual([1, 2, 50].map((a) => backoffDelay(flat, a)), [5000, 5000, 5000]);
    const fractional = policy({ backoff: { base: 1000, max: '1h', multiplier: 1.5, jitter: 'none' } });
    assert.deepEqual([1, 2, 3].map((a) => backoffDelay(fractional, a)), [1000, 1500, 2250]);
  });

  test('huge attempt numbers stay at the cap (no Infinity or NaN)', () => {
    const p = policy({ backoff: { base: '1s', max: '10m', jitter: 'none' } });
    assert.equal(backoffDelay(p, 1_000_000), 600_000);
    const jittered = policy({ backoff: { base: '1s', max: '10m' } });
    assert.equal(backoffDelay(jittered, 1_000_000, () => 0.5), 300_000);
  });

  test('attempt 0 or below counts as the first', () => {
    const p = policy({ backoff: { base: 700, max: '1h', jitter: 'none' } });
    assert.equal(backoffDelay(p, 0), 700);
    assert.equal(backoffDelay(p, -3), 700);
  });

  test('full jitter picks uniformly between 0 and the capped delay, using the injected random', () => {
    const p = policy({ backoff: { base: '1s', max: '10s' } });
    assert.equal(backoffDelay(p, 3, () => 0), 0);
    assert.equal(backoffDelay(p, 3, () => 0.5), 2000);
    assert.equal(backoffDelay(p, 3, () => 0.25), 1000);
    assert.equal(backoffDelay(p, 10, () => 0.5), 5000, 'jitter applies to the capped delay');
    const top = backoffDelay(p, 3, () => 0.999_999_999);
    assert.ok(top >= 3999 && top <= 4000, `just under 1 gives the top of the range, got ${top}`);
    // Sweep the whole range of random(): always within [0, capped].
    for (let attempt = 1; attempt <= 8; attempt++) {
      const capped = Math.min(10_000, 1000 * 2 ** (attempt - 1));
      for (let k = 0; k < 100; k++) {
        const r = k / 100;
        const d = backoffDelay(p, attempt, () => r);
        assert.ok(Number.isInteger(d) && d >= 0 && d <= capped, `attempt ${attempt}, random ${r}: ${d} outside [0, ${capped}]`);
      }
    }
  });

  test('bad retry options are refused with the option named', () => {
    for (const maxAttempts of [0, -1, 1.5, Number.NaN, 1_000_001]) {
      throwsValidation(() => policy({ maxAttempts }), /retry\.maxAttempts/, /integer/);
    }
    for (const multiplier of [0.5, 0, -2, Number.NaN, Number.POSITIVE_INFINITY]) {
      throwsValidation(() => policy({ backoff: { multiplier } }), /retry\.backoff\.multiplier/, />= 1/);
    }
    throwsValidation(() => policy({ backoff: { base: -1 } }), /retry\.backoff\.base/);
    throwsValidation(() => policy({ backoff: { base: 'soon' as never } }), /retry\.backoff\.base/, /not a duration/);
    throwsValidation(() => policy({ backoff: { max: '-1s' as never } }), /retry\.backoff\.max/);
    throwsValidation(() => policy({ backoff: { base: '10s', max: '1s' } }), /retry\.backoff\.max/, /smaller than retry\.backoff\.base/);
    throwsValidation(() => policy({ backoff: { jitter: 'half' as never } }), /retry\.backoff\.jitter/);
    throwsValidation(() => policy({ maxAge: 'forever' as never }), /retry\.maxAge/);
    throwsValidation(() => resolveRetryPolicy({ maxAttempts: 0 }, 'job email.welcome'), /^job email\.welcome:/);
  });

  test('maxAttempts 1 (no retries) and large limits are accepted', () => {
    assert.equal(policy({ maxAttempts: 1 }).maxAttempts, 1);
    assert.equal(policy({ maxAttempts: 1_000_000 }).maxAttempts, 1_000_000);
  });
});

describe('default classifier', () => {
  const withStatus = (status: number, key: 'status' | 'statusCode' = 'status') => Object.assign(new Error(`HTTP ${status}`), { [key]: status });
  const withCode = (code: string) => Object.assign(new Error(code), { code });

  test('PermanentError is permanent', () => {
    assert.deepEqual(defaultClassifier(new PermanentError('no such user')), { category: 'permanent', retry: false });
  });

  test('validation errors are not retried: ValidationError, ZodError and errors named like them', () => {
    assert.deepEqual(defaultClassifier(new ValidationError('bad')), { category: 'validation', retry: false });
    const zodError = (() => {
      try {
        z.object({ email: z.string() }).parse({ email: 1 });
      } catch (error) {
        return error;
      }
      return undefined;
    })();
    assert.equal((zodError as Error).name, 'ZodError');
    assert.deepEqual(defaultClassifier(zodError), { category: 'validation', retry: false });
    const zodMiniError = (() => {
      try {
        zm.parse(zm.object({ email: zm.string() }), { email: 1 });
      } catch (error) {
        return error;
      }
      return undefined;
    })();
    assert.ok(zodMiniError instanceof Error, 'zod/mini throws');
    assert.deepEqual(defaultClassifier(zodMiniError), { category: 'validation', retry: false }, `zod/mini's ${(zodMiniError as Error).name}`);
    for (const name of ['ValidationError', 'ZodError']) {
      const foreign = Object.assign(new Error('invalid'), { name }); // e.g. joi, yup, mongoose name theirs ValidationError
      assert.deepEqual(defaultClassifier(foreign), { category: 'validation', retry: false }, `an error named ${name}`);
    }
  });

  test('HTTP 400, 401, 403, 404 and 422 are permanent (status, statusCode or response.status)', () => {
    for (const status of [400, 401, 403, 404, 422]) {
      assert.deepEqual(defaultClassifier(withStatus(status)), { category: 'permanent', retry: false }, `status ${status}`);
      assert.deepEqual(defaultClassifier(withStatus(status, 'statusCode')), { category: 'permanent', retry: false }, `statusCode ${status}`);
      const axiosLike = Object.assign(new Error('request failed'), { response: { status } });
      assert.deepEqual(defaultClassifier(axiosLike), { category: 'permanent', retry: false }, `response.status ${status}`);
    }
  });

  test('HTTP 408, 429 and 5xx are retried', () => {
    assert.deepEqual(defaultClassifier(withStatus(408)), { category: 'timeout', retry: true });
    for (const status of [429, 500, 502, 503, 504, 599]) {
      const c = defaultClassifier(withStatus(status));
      assert.equal(c.retry, true, `status ${status} is retried`);
      assert.equal(c.category, 'transient', `status ${status}`);
    }
  });

  test('network error codes are retried', () => {
    assert.deepEqual(defaultClassifier(withCode('ETIMEDOUT')), { category: 'timeout', retry: true });
    for (const code of ['ECONNRESET', 'ECONNREFUSED', 'EAI_AGAIN']) {
      assert.deepEqual(defaultClassifier(withCode(code)), { category: 'transient', retry: true }, code);
    }
  });

  test('RetryableError is retried; its `after` becomes retryAfterMs', () => {
    assert.deepEqual(defaultClassifier(new RetryableError('busy')), { category: 'transient', retry: true });
    assert.deepEqual(defaultClassifier(new RetryableError('busy', { after: '30s' })), { category: 'transient', retry: true, retryAfterMs: 30_000 });
    assert.deepEqual(defaultClassifier(new RetryableError('busy', { after: 1500 })), { category: 'transient', retry: true, retryAfterMs: 1500 });
    // RetryableError wins over a status that would otherwise be permanent.
    const explicit = Object.assign(new RetryableError('try again'), { status: 404 });
    assert.equal(defaultClassifier(explicit).retry, true);
  });

  test('RetryableError and RateLimitedError read a Retry-After header as sent: seconds, an HTTP date, or absent', () => {
    assert.equal(new RetryableError('busy', { after: '120' }).afterMs, 120_000);
    assert.equal(new RetryableError('busy', { after: ' 7 ' }).afterMs, 7_000);
    const inAMinute = new Date(Date.now() + 60_000).toUTCString();
    const dated = new RetryableError('busy', { after: inAMinute }).afterMs!;
    assert.ok(dated > 55_000 && dated <= 60_000, `an HTTP date a minute ahead is about 60 s, got ${dated}`);
    assert.equal(new RetryableError('busy', { after: 'Wed, 21 Oct 2015 07:28:00 GMT' }).afterMs, 0, 'a date in the past is now');
    const asctime = new Date(Date.now() + 120_000);
    const months = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
    const days = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'];
    const two = (n: number) => String(n).padStart(2, '0');
    const asc = `${days[asctime.getUTCDay()]} ${months[asctime.getUTCMonth()]} ${String(asctime.getUTCDate()).padStart(2, ' ')} ${two(asctime.getUTCHours())}:${two(asctime.getUTCMinutes())}:${two(asctime.getUTCSeconds())} ${asctime.getUTCFullYear()}`;
    const ascMs = new RetryableError('busy', { after: asc }).afterMs!;
    assert.ok(ascMs > 115_000 && ascMs <= 120_000, `asctime (${asc}) is read in GMT: ${ascMs}`);
    const year = 366 * 24 * 3600_000;
    assert.equal(new RetryableError('busy', { after: '9999999999999999999' }).afterMs, year, 'a wait longer than a year is a year (a run time must fit a timestamp)');
    assert.equal(new RateLimitedError('slow', { after: 1e20 }).afterMs, year);
    assert.equal(new RetryableError('busy', { after: new Date(Date.now() - 5) }).afterMs, 0);
    assert.equal(new RetryableError('busy', { after: null }).afterMs, undefined, 'headers.get() of an absent header');
    assert.deepEqual(defaultClassifier(new RetryableError('busy', { after: null })), { category: 'transient', retry: true });
    assert.equal(new RateLimitedError('slow', { after: null }).afterMs, 1000, 'a rate limit without a value backs off 1 s');
    assert.equal(new RateLimitedError('slow', { after: '3' }).afterMs, 3000);
    assert.equal(new RateLimitedError('slow', { after: '250ms' }).afterMs, 250);
  });

  test('an `after` that cannot be read never throws: the backoff applies and the recorded message says why', () => {
    const bad: unknown[] = ['nulls', 'soon', '-5', -5, Number.NaN, '1.5', new Date('nope'), {}];
    for (const after of bad) {
      const error = new RetryableError('busy', { after: after as string });
      assert.equal(error.afterMs, undefined, String(after));
      assert.match(error.afterProblem ?? '', /RetryableError\.after/, `the problem names the option for ${String(after)}`);
      assert.deepEqual(defaultClassifier(error), { category: 'transient', retry: true });
      const limited = new RateLimitedError('slow', { after: after as string });
      assert.equal(limited.afterMs, 1000);
      assert.match(limited.afterProblem ?? '', /RateLimitedError\.after/);
    }
  });

  test('timeouts and aborts are retried as timeout', () => {
    assert.deepEqual(defaultClassifier(new JobTimeoutError('too slow')), { category: 'timeout', retry: true });
    assert.deepEqual(defaultClassifier(Object.assign(new Error('aborted'), { name: 'AbortError' })), { category: 'timeout', retry: true });
    assert.deepEqual(defaultClassifier(Object.assign(new Error('timed out'), { name: 'TimeoutError' })), { category: 'timeout', retry: true });
  });

  test('a job type with no handler is unknown-type, not retried', () => {
    assert.deepEqual(defaultClassifier(new UnknownJobTypeError('no handler')), { category: 'unknown-type', retry: false });
  });

  test('plain errors and non-errors are retried as transient', () => {
    for (const thrown of [new Error('boom'), new TypeError('x is undefined'), 'a string', 42, null, undefined, { message: 'object' }]) {
      assert.deepEqual(defaultClassifier(thrown), { category: 'transient', retry: true }, `thrown: ${String(thrown)}`);
    }
    // A status outside 100-599 is not an HTTP status.
    assert.deepEqual(defaultClassifier(withStatus(42)), { category: 'transient', retry: true });
  });
});

describe('snooze', () => {
  test('snooze(d) carries the delay and is recognised', () => {
    const s = snooze('10m');
    assert.equal(s.delayMs, 600_000);
    assert.equal(isSnooze(s), true);
    assert.equal(snooze(250).delayMs, 250);
    assert.equal(snooze(0).delayMs, 0);
  });

  test('other return values are not snoozes', () => {
    for (const value of [undefined, null, 0, 'snooze', { delayMs: 1000 }, [], () => {}]) assert.equal(isSnooze(value), false);
  });

  test('a bad snooze duration is refused', () => {
    throwsValidation(() => snooze(-1), /^snooze:/);
    throwsValidation(() => snooze('later' as never), /^snooze:/, /not a duration/);
  });
});

describe('UUIDv7 ids', () => {
  const timestampOf = (id: string) => parseInt(id.replaceAll('-', '').slice(0, 12), 16);

  test('have version 7, variant 10, the given time in the first 48 bits, and the UUID shape', () => {
    for (let i = 0; i < 200; i++) {
      const id = newId();
      assert.ok(isUuid(id), id);
      assert.match(id, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/, id);
    }
    const t = Date.UTC(2030, 0, 1);
    assert.equal(timestampOf(newId(t)), t);
  });

  test('sort in creation order within one millisecond (and across the 4096-per-ms counter)', () => {
    const t = Date.UTC(2031, 0, 1);
    const ids = Array.from({ length: 10_000 }, () => newId(t));
    assert.equal(new Set(ids).size, ids.length, 'unique');
    for (let i = 1; i < ids.length; i++) assert.ok(ids[i - 1]! < ids[i]!, `ids[${i - 1}] < ids[${i}]: ${ids[i - 1]} ${ids[i]}`);
    assert.equal(timestampOf(ids[0]!), t);
    assert.ok(timestampOf(ids.at(-1)!) > t, 'after 4096 ids in one ms the timestamp moves on rather than wrapping');
  });

  test('carry fresh random bits in every id, across many refills of the random pool', () => {
    const t = Date.UTC(2033, 0, 1);
    // The last 62 bits are random: 10,000 ids (about 40 refills of the 256-id pool) share none.
    const tails = Array.from({ length: 10_000 }, () => newId(t).slice(-12));
    assert.equal(new Set(tails).size, tails.length, 'no random tail repeats');
    const counts = new Array<number>(16).fill(0);
    for (const tail of tails) counts[parseInt(tail[0]!, 16)]!++;
    for (const n of counts) assert.ok(n > 400 && n < 850, `the first random digit spreads evenly: ${counts.join(' ')}`);
  });

  test('stay in order when the clock goes backwards', () => {
    const a = newId(Date.UTC(2032, 0, 1));
    const b = newId(Date.UTC(2032, 0, 1) - 5000);
    const c = newId(Date.UTC(2032, 0, 1) + 1);
    assert.ok(a < b && b < c, `${a} < ${b} < ${c}`);
  });

  test('isUuid accepts any UUID and nothing else', () => {
    assert.equal(isUuid('00000000-0000-4000-8000-000000000000'), true);
    assert.equal(isUuid('0190D6A8-0000-7000-8000-000000000000'), true);
    for (const bad of ['', 'not-a-uuid', '00000000-0000-4000-8000-00000000000', '00000000000040008000000000000000', "' OR 1=1 --", 42, null]) {
      assert.equal(isUuid(bad), false, String(bad));
    }
  });
});

describe('identifiers', () => {
  const injection = 'x"; DROP TABLE jobs; --';

  test('schema names: 1-50 lower-case letters, digits or _, starting with a letter or _; returned quoted', () => {
    assert.equal(quoteSchema('mailroom'), '"mailroom"');
    for (const ok of ['a', '_x', 'tenant_42', 'a'.repeat(50)]) assert.equal(quoteSchema(ok), `"${ok}"`);
    for (const bad of ['', 'Mailroom', '1abc', 'a-b', 'a.b', 'a b', 'a"b', "a'b", 'a;b', 'a'.repeat(51), injection, 'ü', 'a\n', 'a\u0000']) {
      throwsValidation(() => quoteSchema(bad), /^schema:/, /not a valid schema name/, /1-50 lower-case/);
    }
    for (const bad of [42, null, undefined, ['mailroom']]) throwsValidation(() => quoteSchema(bad as never), /^schema:/);
  });

  test('queue and job names: 1-128 of letters, digits, _ . : -, starting with a letter or digit', () => {
    for (const ok of ['email', 'email.welcome', 'Orders:v2', 'a-b_c.d:e', '1st', 'x'.repeat(128)]) assertName(ok, 'queue');
    for (const bad of ['', '.x', '-x', '_x', 'a b', 'a"b', "a'b", 'a;b', 'a/b', 'x'.repeat(129), injection, 'a\nb', 'abc\n', 'é', 'a\u0000']) {
      throwsValidation(() => assertName(bad, 'queue of job x'), /^queue of job x:/, /is not valid/, /1-128 characters/);
    }
    for (const bad of [42, null, undefined, {}]) throwsValidation(() => assertName(bad, 'job name'), /^job name:/);
  });

  test('the error shows the bad value JSON-quoted, so quotes and control characters are visible', () => {
    throwsValidation(() => assertName(injection, 'queue'), /"x\\"; DROP TABLE jobs; --"/);
    throwsValidation(() => assertName('a\nb', 'queue'), /"a\\nb"/);
  });
});

describe('payload serialisation', () => {
  test('plain JSON is serialised; undefined becomes null', () => {
    assert.equal(serializePayload({ a: 1, b: [true, null, 'x'] }, DEFAULT_MAX_PAYLOAD_BYTES, 'job t'), '{"a":1,"b":[true,null,"x"]}');
    assert.equal(serializePayload(undefined, DEFAULT_MAX_PAYLOAD_BYTES, 'job t'), 'null');
    assert.equal(DEFAULT_MAX_PAYLOAD_BYTES, 1024 * 1024);
  });

  test('BigInt, cycles and functions are refused with a hint', () => {
    throwsValidation(() => serializePayload({ n: 1n }, 1000, 'job t'), /^job t:/, /not JSON-serialisable/, /BigInt/);
    const cycle: Record<string, unknown> = {};
    cycle.self = cycle;
    throwsValidation(() => serializePayload(cycle, 1000, 'job t'), /not JSON-serialisable/, /circular/);
    throwsValidation(() => serializePayload(() => 1, 1000, 'job t'), /not JSON-serialisable/);
  });

  test('the size limit counts UTF-8 bytes and is named in the error', () => {
    const text = serializePayload('é'.repeat(4), 10, 'job t'); // "éééé" = 2 + 8 bytes
    assert.equal(Buffer.byteLength(text), 10);
    throwsValidation(() => serializePayload('é'.repeat(5), 10, 'job t'), /12 bytes/, /limit of 10 bytes/, /maxPayloadBytes/);
  });

  test('NUL characters are refused; the text "\\u0000" (a backslash, then u0000) is not a NUL and is kept', () => {
    throwsValidation(() => serializePayload({ s: 'a\u0000b' }, 1000, 'job t'), /NUL character/);
    throwsValidation(() => serializePayload({ ['k\u0000']: 1 }, 1000, 'job t'), /NUL character/);
    throwsValidation(() => serializePayload({ s: '\\\u0000' }, 1000, 'job t'), /NUL character/); // a backslash, then a real NUL
    assert.equal(serializePayload({ s: 'C:\\u0000' }, 1000, 'job t'), '{"s":"C:\\\\u0000"}');
    assert.equal(serializePayload({ s: '\\\\u0000' }, 1000, 'job t'), '{"s":"\\\\\\\\u0000"}');
  });

  test('lone UTF-16 surrogates (which jsonb cannot store) are refused; pairs are fine', () => {
    throwsValidation(() => serializePayload({ s: '\ud800' }, 1000, 'job t'), /^job t:/, /surrogate/);
    throwsValidation(() => serializePayload({ s: 'a\udc00b' }, 1000, 'job t'), /surrogate/);
    assert.equal(serializePayload({ s: '\ud83d\ude00' }, 1000, 'job t'), '{"s":"😀"}');
    assert.equal(serializePayload({ s: '\\ud800' }, 1000, 'job t'), '{"s":"\\\\ud800"}', 'the text \\ud800 is not a surrogate');
  });
});

describe('retry horizon', () => {
  test('the backoff delays, plus each run up to its timeout; with maxAge, the age plus one run', () => {
    const three = resolveRetryPolicy({ maxAttempts: 3, backoff: { base: '1s', max: '1h' } }, 'unit');
    assert.equal(retryHorizonMs({ retry: three }), 1000 + 2000);
    assert.equal(retryHorizonMs({ retry: three, timeoutMs: 60_000 }), 1000 + 2000 + 3 * 60_000, 'three runs of up to a minute');
    const aged = resolveRetryPolicy({ maxAttempts: 3, maxAge: '1h' }, 'unit');
    assert.equal(retryHorizonMs({ retry: aged }), 3_600_000);
    assert.equal(retryHorizonMs({ retry: aged, timeoutMs: 60_000 }), 3_660_000, 'an attempt may start just before the age runs out');
  });
});

describe('payload check at consume', () => {
  const sold = defineEvent('unit.item-sold', { version: 1, schema: z.object({ cents: z.string().transform(Number) }) });
  const foreign = (data: unknown, extra: Record<string, unknown> = {}) =>
    fromEnvelope({ specversion: '1.0', id: 'ext-1', source: 'https://other.example', type: sold.type, data, ...extra });

  test('an event of another producer is checked against the definition and gets its output; one that does not match is a ValidationError naming the field', async () => {
    assert.deepEqual((await checkedEvent(foreign({ cents: '250' }), sold as never, 'g')).data, { cents: 250 });
    await assert.rejects(checkedEvent(foreign({ cents: 250 }), undefined, 'g'), (e: unknown) => e instanceof ValidationError && /^consumer g: event ext-1 \(unit\.item-sold v1\): invalid payload: data\.cents: /.test(e.message));
  });

  test("a mailroom's own event of the definition's type and version is taken as stored (validated at publish)", async () => {
    const ours = foreign({ cents: 250 }, { dataschema: `urn:mailroom:${sold.type}:v1` });
    assert.equal(await checkedEvent(ours, sold as never, 'g'), ours);
    const older = foreign({ cents: 250 }, { dataschema: `urn:mailroom:${sold.type}:v2` });
    await assert.rejects(checkedEvent(older, sold as never, 'g'), /against unit\.item-sold v1's schema: invalid payload/);
  });
});

describe('job definitions', () => {
  test('a name defined again with another queue is refused; with the same queue it replaces the definition', () => {
    const first = defineJob('unit.redefined', { queue: 'alpha' });
    const again = defineJob('unit.redefined', { queue: 'alpha', retry: { maxAttempts: 3 } });
    assert.equal(again.retry.maxAttempts, 3);
    assert.notEqual(first, again);
    throwsValidation(() => defineJob('unit.redefined', { queue: 'beta' }), /^job unit\.redefined is already defined for queue "alpha", not "beta": a job type belongs to one queue/);
    throwsValidation(() => defineJob('unit.redefined'), /already defined for queue "alpha", not "default"/);
  });
});

describe('decideFailure', () => {
  let seq = 0;
  const row = (type: string, attempt: number, maxAttempts: number): ClaimedRow => ({
    id: newId(),
    queue: 'default',
    type,
    payload: {},
    attempt,
    max_attempts: maxAttempts,
    claim_count: attempt,
    priority: 0,
    correlation_id: null,
    traceparent: null,
    created_at: new Date(),
    expires_at: null,
    ordering_key: null,
    ordering_seq: null,
    blocked: false,
  });
  const job = (retry: RetryOptions, extra: Parameters<typeof defineJob>[1] = {}) =>
    defineJob(`unit.decide.${seq++}`, { retry, ...extra });
  const half = () => 0.5;

  test('a RetryableError whose `after` cannot be read is retried with the backoff, the message saying why', () => {
    const def = job({ backoff: { base: '1s', max: '1s', jitter: 'none' } });
    const decided = decideFailure(row(def.name, 1, 5), new RetryableError('busy', { after: 'soon' }), half);
    assert.deepEqual([decided.retry, decided.delayMs], [true, 1000]);
    assert.match(decided.message, /^busy \(RetryableError\.after: "soon" is neither a duration .* the usual delay was used\)$/);
  });

  test('a classifier that throws falls back to the default: a failure always gets a decision', () => {
    const def = job({}, { classify: () => { throw new Error('classifier bug'); } });
    const decided = decideFailure(row(def.name, 1, 3), Object.assign(new Error('gone'), { status: 404 }));
    assert.deepEqual([decided.retry, decided.category], [false, 'permanent']);
  });

  test('a retryable failure with attempts left is retried after the job type\'s backoff', () => {
    const def = job({ maxAttempts: 5, backoff: { base: '1s', max: '1m' } });
    for (const attempt of [1, 2, 3, 4]) {
      const outcome = decideFailure(row(def.name, attempt, 5), new Error('flaky'), half);
      assert.equal(outcome.retry, true);
      assert.equal(outcome.category, 'transient');
      assert.equal(outcome.delayMs, backoffDelay(def.retry, attempt, half));
      assert.equal(outcome.delayMs, 500 * 2 ** (attempt - 1));
      assert.equal(outcome.message, 'flaky');
      assert.match(outcome.stack ?? '', /flaky/);
    }
    const noJitter = job({ maxAttempts: 5, backoff: { base: 200, max: 300, jitter: 'none' } });
    assert.equal(decideFailure(row(noJitter.name, 1, 5), new Error('x')).delayMs, 200);
    assert.equal(decideFailure(row(noJitter.name, 3, 5), new Error('x')).delayMs, 300, 'capped');
  });

  test('exhausted attempts: dead with reason max-attempts, keeping the category of the last error', () => {
    const def = job({ maxAttempts: 3 });
    const outcome = decideFailure(row(def.name, 3, 3), new Error('still flaky'), half);
    assert.deepEqual(
      { retry: outcome.retry, deadReason: outcome.deadReason, category: outcome.category, delayMs: outcome.delayMs },
      { retry: false, deadReason: 'max-attempts', category: 'transient', delayMs: 0 },
    );
    const timedOut = decideFailure(row(def.name, 3, 3), Object.assign(new Error('t'), { code: 'ETIMEDOUT' }));
    assert.deepEqual([timedOut.retry, timedOut.deadReason, timedOut.category], [false, 'max-attempts', 'timeout']);
    const withAfter = decideFailure(row(def.name, 3, 3), new RetryableError('busy', { after: '1m' }));
    assert.deepEqual([withAfter.retry, withAfter.deadReason], [false, 'max-attempts'], 'Retry-After does not add attempts');
    const single = job({ maxAttempts: 1 });
    assert.equal(decideFailure(row(single.name, 1, 1), new Error('once')).deadReason, 'max-attempts');
  });

  test('a permanent failure is dead at once with its category as the reason', () => {
    const def = job({ maxAttempts: 10 });
    const cases: [unknown, string][] = [
      [new PermanentError('gone'), 'permanent'],
      [Object.assign(new Error('unprocessable'), { status: 422 }), 'permanent'],
      [new ValidationError('bad field'), 'validation'],
      [new UnknownJobTypeError('no handler'), 'unknown-type'],
    ];
    for (const [error, reason] of cases) {
      const outcome = decideFailure(row(def.name, 1, 10), error, half);
      assert.deepEqual(
        { retry: outcome.retry, deadReason: outcome.deadReason, category: outcome.category, delayMs: outcome.delayMs },
        { retry: false, deadReason: reason, category: reason, delayMs: 0 },
        String(error),
      );
    }
  });

  test('RetryableError `after` overrides the backoff', () => {
    const def = job({ maxAttempts: 5, backoff: { base: '1s', max: '2s' } });
    assert.equal(decideFailure(row(def.name, 1, 5), new RetryableError('rate limited', { after: '30s' }), half).delayMs, 30_000);
    assert.equal(decideFailure(row(def.name, 2, 5), new RetryableError('rate limited', { after: 0 }), half).delayMs, 0);
    assert.equal(decideFailure(row(def.name, 1, 5), new RetryableError('rate limited'), half).delayMs, 500, 'no after: backoff');
  });

  test('a job type\'s own classifier decides (from defineJob({ classify }))', () => {
    const notFoundIsTransient = job(
      { maxAttempts: 5, backoff: { base: 100, jitter: 'none' } },
      { classify: (error) => ((error as { status?: number }).status === 404 ? { category: 'transient', retry: true } : defaultClassifier(error)) },
    );
    const missing = decideFailure(row(notFoundIsTransient.name, 1, 5), Object.assign(new Error('not yet'), { status: 404 }));
    assert.deepEqual([missing.retry, missing.category, missing.delayMs], [true, 'transient', 100]);
    const everythingPermanent = job({ maxAttempts: 5 }, { classify: () => ({ category: 'permanent', retry: false }) });
    const plain = decideFailure(row(everythingPermanent.name, 1, 5), new Error('plain'));
    assert.deepEqual([plain.retry, plain.deadReason], [false, 'permanent']);
    const withAfter = job({ maxAttempts: 5 }, { classify: () => ({ category: 'transient', retry: true, retryAfterMs: 4242 }) });
    assert.equal(decideFailure(row(withAfter.name, 1, 5), new Error('x')).delayMs, 4242);
    // The same error under a type without a custom classifier uses the default.
    const plainDef = job({ maxAttempts: 5 });
    assert.equal(decideFailure(row(plainDef.name, 1, 5), Object.assign(new Error('not found'), { status: 404 })).retry, false);
  });

  test('a classifier that throws falls back to the default classifier', () => {
    const def = job({ maxAttempts: 5 }, {
      classify: () => {
        throw new Error('classifier bug');
      },
    });
    const outcome = decideFailure(row(def.name, 1, 5), new PermanentError('gone'));
    assert.deepEqual([outcome.retry, outcome.deadReason], [false, 'permanent']);
    assert.equal(decideFailure(row(def.name, 1, 5), new Error('flaky')).retry, true);
  });

  test('a type no definition is registered for uses the default policy and classifier', () => {
    const outcome = decideFailure(row('unit.never.defined', 1, 25), new Error('flaky'), half);
    assert.deepEqual([outcome.retry, outcome.delayMs], [true, 500]);
    const dead = decideFailure(row('unit.never.defined', 1, 25), new UnknownJobTypeError('no handler'));
    assert.deepEqual([dead.retry, dead.deadReason], [false, 'unknown-type']);
  });

  test('non-Error throws are described readably', () => {
    const def = job({ maxAttempts: 5 });
    assert.equal(decideFailure(row(def.name, 1, 5), 'just a string').message, 'just a string');
    assert.equal(decideFailure(row(def.name, 1, 5), { code: 'E_THING', detail: 1 }).message, '{"code":"E_THING","detail":1}');
    assert.equal(decideFailure(row(def.name, 1, 5), 'x').stack, null);
    const huge = decideFailure(row(def.name, 1, 5), new Error('m'.repeat(50_000)));
    assert.ok(huge.message.length <= 10_000, 'long messages are truncated');
  });
});

describe('SerialLane', () => {
  test('runs tasks one at a time in the order given; a failed task does not stop the next', async () => {
    const lane = new SerialLane();
    const log: string[] = [];
    let running = 0;
    const task = (name: string, fail = false) => async () => {
      running++;
      assert.equal(running, 1, `${name} started while another task ran`);
      log.push(`start ${name}`);
      await new Promise((resolve) => setTimeout(resolve, 5));
      log.push(`end ${name}`);
      running--;
      if (fail) throw new Error(`${name} failed`);
      return name;
    };
    const results = await Promise.allSettled([lane.run(task('a')), lane.run(task('b', true)), lane.run(task('c'))]);
    assert.deepEqual(log, ['start a', 'end a', 'start b', 'end b', 'start c', 'end c']);
    assert.deepEqual(results.map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled']);
    assert.equal(results[2]?.status === 'fulfilled' ? results[2].value : undefined, 'c');
  });
});

describe('Waker', () => {
  test('a poke ends the current sleep; a poke before the sleep is kept for it; otherwise the sleep lasts its time', async () => {
    const waker = new Waker();
    let t = performance.now();
    setTimeout(() => waker.poke(), 10);
    await waker.sleep(5_000);
    assert.ok(performance.now() - t < 1_000, 'the poke ended a 5 s sleep early');
    waker.poke();
    t = performance.now();
    await waker.sleep(5_000);
    assert.ok(performance.now() - t < 100, 'a poke that came before the sleep counts');
    t = performance.now();
    await waker.sleep(30);
    assert.ok(performance.now() - t >= 25, 'the kept poke was used up: this sleep ran its time');
  });
});

describe('Signal', () => {
  test('a fire ends every wait in progress and is not kept; a wait without a fire lasts its time, an endless one until a fire', async () => {
    const signal = new Signal();
    signal.fire(); // nobody waits: not kept
    let t = performance.now();
    await signal.wait(30);
    assert.ok(performance.now() - t >= 25, 'a fire before the wait did not end it');
    t = performance.now();
    setTimeout(() => signal.fire(), 10);
    await Promise.all([signal.wait(5_000), signal.wait(5_000)]);
    assert.ok(performance.now() - t < 1_000, 'one fire ended both 5 s waits early');
    let ended = false;
    const endless = signal.wait(Number.POSITIVE_INFINITY).then(() => void (ended = true));
    const tooLong = signal.wait(2 ** 40).then(() => void (ended = true));
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(ended, false, 'a wait of Infinity, or past what a timer holds, does not end at once');
    signal.fire();
    await Promise.all([endless, tooLong]);
    assert.equal(ended, true);
  });
});

describe('CoalescingBatch', () => {
  test('items handed in together go in one write, split at maxBatch; each gets its own result in order', async () => {
    const writes: number[][] = [];
    const batch = new CoalescingBatch<number, string>(async (items) => {
      writes.push(items);
      return items.map((n) => `r${n}`);
    }, 3);
    const results = await Promise.all([1, 2, 3, 4, 5].map((n) => batch.add(n)));
    assert.deepEqual(results, ['r1', 'r2', 'r3', 'r4', 'r5']);
    assert.deepEqual(writes, [[1, 2, 3], [4, 5]]);
  });

  test('items handed in while a write is in flight join the next write; a failed write rejects its items only', async () => {
    const writes: number[][] = [];
    let release: () => void = () => {};
    const first = new Promise<void>((resolve) => (release = resolve));
    const batch = new CoalescingBatch<number, number>(async (items) => {
      writes.push(items);
      if (writes.length === 1) await first;
      if (items.includes(13)) throw new Error('write failed');
      return items.map((n) => n * 10);
    });
    const a = batch.add(1);
    await new Promise((resolve) => setImmediate(resolve));
    await new Promise((resolve) => setImmediate(resolve)); // the first write is in flight
    const b = batch.add(2);
    const c = batch.add(13);
    release();
    assert.equal(await a, 10);
    await assert.rejects(b, /write failed/);
    await assert.rejects(c, /write failed/);
    assert.deepEqual(writes, [[1], [2, 13]]);
    assert.equal(await batch.add(4), 40, 'a failed write does not stop the next');
  });

  test('settleUnsent resolves the items not yet written; drain waits for the writes in flight', async () => {
    let written = 0;
    const batch = new CoalescingBatch<number, boolean>(async (items) => {
      await new Promise((resolve) => setTimeout(resolve, 5));
      written += items.length;
      return items.map(() => true);
    });
    const sent = batch.add(1);
    const unsent = batch.add(2);
    batch.settleUnsent(false); // before the loop's first turn: neither was sent
    assert.deepEqual(await Promise.all([sent, unsent]), [false, false]);
    const later = batch.add(3);
    await batch.drain();
    assert.equal(written, 1);
    assert.equal(await later, true);
  });
});

describe('runNamed', () => {
  test('runs the named statement where the handle can prepare it, and its text where it cannot (a caller\'s transaction)', async () => {
    const statement: NamedQuery = { name: 'mailroom_thing_s', text: 'SELECT $1::int AS n' };
    const sent: unknown[][] = [];
    const answer = { rows: [{ n: 1 }], rowCount: 1 } as QueryResult<never>;
    const preparing = {
      run: async (q: NamedQuery, params: readonly unknown[]) => (sent.push(['run', q.name, ...params]), answer),
      query: async (text: string, params?: readonly unknown[]) => (sent.push(['query', text, ...(params ?? [])]), answer),
    };
    const plain = { query: preparing.query };
    assert.deepEqual(await runNamed(preparing, statement, [1]), answer);
    assert.deepEqual(await runNamed(plain, statement, [2]), answer);
    assert.deepEqual(sent, [
      ['run', 'mailroom_thing_s', 1],
      ['query', 'SELECT $1::int AS n', 2],
    ]);
  });
});

describe('Completer', () => {
  const query = (name: string): NamedQuery => ({ name, text: name });
  const queries = { complete: query('complete'), completeOne: query('complete_one'), completeRecordingInbox: query('complete_recording_inbox') } as unknown as JobQueries;
  /**
   * A driver whose `run` answers with `answer`, given the ids written (a stand-in: what is tested is
   * the completer's retrying and its choice of statement); it records each statement's name and parameters.
   */
  const fakeDriver = (answer: (attempt: number, ids: readonly string[]) => string[]): { driver: Driver; calls: number; sent: [string, unknown[]][] } => {
    const state = { calls: 0, sent: [] as [string, unknown[]][], driver: undefined as unknown as Driver };
    state.driver = {
      run: async (q: NamedQuery, params: readonly unknown[]) => {
        state.sent.push([q.name, [...params]]);
        const ids = Array.isArray(params[0]) ? (params[0] as string[]) : [params[0] as string];
        const rows = answer(++state.calls, ids).map((id) => ({ id }));
        return { rows, rowCount: rows.length };
      },
    } as unknown as Driver;
    return state;
  };
  const hooks = (reported: unknown[]) => ({ report: (e: unknown) => reported.push(e), givingUp: () => false, serialize: <T>(w: () => Promise<T>) => w() });
  const conflict = (code: string) => Object.assign(new Error(`conflict ${code}`), { code });

  test('a deadlock or serialization failure is run again at once, unreported; the result is what the second write returned', async () => {
    assert.equal(isConcurrencyConflict(conflict('40P01')), true);
    assert.equal(isConcurrencyConflict(conflict('40001')), true);
    assert.equal(isConcurrencyConflict(conflict('57P01')), false);
    assert.equal(isConcurrencyConflict(null), false);
    for (const code of ['40P01', '40001']) {
      const reported: unknown[] = [];
      const fake = fakeDriver((attempt, ids) => {
        if (attempt === 1) throw conflict(code);
        return ids.filter((id) => id !== 'stale');
      });
      const completer = new Completer(fake.driver, queries, hooks(reported));
      const results = await Promise.all([completer.complete('a', 1), completer.complete('stale', 1)]);
      assert.deepEqual(results, [true, false]);
      assert.equal(fake.calls, 2, `${code}: written twice`);
      assert.deepEqual(reported, [], `${code}: the first conflict is not reported`);
    }
  });

  test('other failures, and a second conflict, are reported and retried with backoff', async () => {
    const reported: unknown[] = [];
    const fake = fakeDriver((attempt, ids) => {
      if (attempt === 1) throw conflict('40P01');
      if (attempt === 2) throw conflict('40P01');
      if (attempt === 3) throw conflict('57P01');
      return [...ids];
    });
    const completer = new Completer(fake.driver, queries, hooks(reported));
    assert.equal(await completer.complete('a', 1), true);
    assert.equal(fake.calls, 4);
    assert.deepEqual(reported.map((e) => (e as { code: string }).code), ['40P01', '57P01']);
  });

  test('a batch of one without an inbox key is written with the single-job statement, scalar parameters; larger batches and inbox keys with the batched ones', async () => {
    const fake = fakeDriver((_attempt, ids) => ids.filter((id) => id !== 'stale'));
    const completer = new Completer(fake.driver, queries, hooks([]));
    assert.equal(await completer.complete('a', 3), true);
    assert.equal(await completer.complete('stale', 1), false, 'the single statement reports a fenced-out job as not completed');
    assert.deepEqual(await Promise.all([completer.complete('b', 1), completer.complete('c', 2)]), [true, true]);
    assert.equal(await completer.complete('d', 1, { group: 'g', key: 'k' }), true);
    assert.deepEqual(fake.sent, [
      ['complete_one', ['a', 3]],
      ['complete_one', ['stale', 1]],
      ['complete', [['b', 'c'], [1, 2]]],
      ['complete_recording_inbox', [['d'], [1], ['g'], ['k']]],
    ]);
  });
});

describe('planBatch', () => {
  // A stand-in for the candidates statement: keyless rows, returned in the order given, their digit,
  // uuid and timestamp columns packed as packedEventColumns packs them (no previous row of a key).
  const queries = relayQueries('"s"');
  const row = (xid: number, position: number) => ({
    fence: '100', packed: [position, xid, newId(), '2026-01-01T00:00:00.000Z', 1, '', ''].join('\x1f'), type: 't.e', subject: null,
    correlation_id: null, causation_id: null, traceparent: null, source: 'mailroom://test', extensions: null, data: '{}',
  });
  const runner = (rows: ReturnType<typeof row>[]) => ({
    run: async <R>(query: NamedQuery) => {
      assert.equal(query.name, queries.candidates.name);
      return { rows: rows as R[], rowCount: rows.length } as unknown as QueryResult<R>;
    },
  });

  test('reads candidates in (xid, position) order even when the statement returns them otherwise', async () => {
    const ordered = [row(5, 9), row(6, 3), row(6, 4), row(7, 1)];
    const shuffled = [ordered[2]!, ordered[0]!, ordered[3]!, ordered[1]!];
    const cursor = { xid: 1n, position: 0n };
    const fromOrdered = await planBatch(runner(ordered), queries, cursor, null, 10);
    const fromShuffled = await planBatch(runner(shuffled), queries, cursor, null, 10);
    assert.deepEqual(fromShuffled.cursor, { xid: 7n, position: 1n }, 'the cursor is the last row in (xid, position) order');
    assert.deepEqual(fromShuffled, fromOrdered);
    assert.deepEqual(fromShuffled.rows.map((r) => r.position), ['1', '3', '4', '9'], 'delivered in position order');
  });
});

describe("a read-ahead relay's known cursor", () => {
  const cursor = { xid: 100n, position: 7n };
  const known = { cursor, token: '3', renewedAt: 1_000 };
  test('is read past while the lease renewed with it has more than half its time left, under the same token', () => {
    assert.equal(knownCursorStillHeld(known, '3', 1_000, 30_000), cursor);
    assert.equal(knownCursorStillHeld(known, '3', 15_999, 30_000), cursor);
  });
  test('is read again from the database from half the lease on, under another token, or when none is known', () => {
    assert.equal(knownCursorStillHeld(known, '3', 16_000, 30_000), null, 'half the lease gone: another relay may take it before the batch is published');
    assert.equal(knownCursorStillHeld(known, '3', 1_060, 100), null, 'a short lease: 60 ms of 100 gone');
    assert.equal(knownCursorStillHeld(known, '4', 1_000, 30_000), null, 'the lease was taken again since: a new token');
    assert.equal(knownCursorStillHeld(null, '3', 1_000, 30_000), null);
  });
});
