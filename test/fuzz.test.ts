/**
 * Guarantee 6 under generated input (issue #8, "Bad input"): every entry point
 * a user or a network peer reaches is fed hostile values by fast-check, and
 * each must end in a clear error (the right class, a message naming the field
 * or option) or, for broker messages, a dead letter with category
 * `validation` / `unknown-type`, while the process keeps running and nothing
 * else is lost or corrupted: after each batch the good jobs and events written
 * before are checked row by row, and a worker still runs them all.
 *
 * Seeds are fixed (test/helpers/fuzz.ts): a failure prints the seed and the
 * shrunk counterexample; `MAILROOM_FUZZ_SEED` reproduces it and
 * `MAILROOM_FUZZ_RUNS` runs every property longer.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import fc from 'fast-check';
import { z } from 'zod';
import { defineEvent, defineJob, INVALID_MESSAGE_TYPE, ValidationError, type ConsumedEvent } from '../src/index.ts';
import { testDatabases, type TestMailroom } from './helpers/databases.ts';
import { eventually } from './helpers/events.ts';
import {
  anyString,
  fuzz,
  hasLoneSurrogate,
  optionOf,
  payload,
  payloadOutcome,
  textNear,
  textVerdict,
  WRONG_CONSTANTS,
  wrongValue,
  type PayloadOutcome,
  type Verdict,
} from './helpers/fuzz.ts';
import { flushUntil } from './helpers/relay.ts';
import { scriptedSource } from './helpers/scripted-source.ts';

/** The payload limit of the fuzzed mailrooms: small, so sizes around it are cheap to generate. */
const LIMIT = 4096;
const plain = defineJob(`fuzz.plain.p${process.pid}`, { queue: 'fuzz' });
const typedSchema = z.object({ n: z.number(), tags: z.array(z.string()).optional(), extra: z.unknown().optional() });
const typed = defineJob(`fuzz.typed.p${process.pid}`, { queue: 'fuzz', schema: typedSchema });
const control = defineJob(`fuzz.control.p${process.pid}`, { queue: 'fuzz' });
const recorded = defineEvent('fuzzing.value-recorded', { version: 1 });
const checked = defineEvent('fuzzing.value-checked', { version: 1, schema: typedSchema });
const arrived = defineEvent('fuzzing.message-arrived', { version: 1 });
const stranger = defineEvent('fuzzing.stranger-arrived', { version: 1 });

const MAX_DELAY_MS = 100 * 365 * 86_400_000;
const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** The oracle for `delay`: milliseconds or '<number><unit>', finite, 0 to 100 years. */
function delayVerdict(value: unknown): Verdict {
  if (value === undefined) return 'ok';
  let ms: number;
  if (typeof value === 'number') ms = value;
  else if (typeof value === 'string') {
    const match = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$/.exec(value.trim());
    if (!match) return 'bad';
    ms = Number(match[1]) * UNIT_MS[match[2]!]!;
  } else return 'bad';
  if (!Number.isFinite(ms) || ms < 0) return 'bad';
  if (Math.abs(ms - MAX_DELAY_MS) < 1) return 'either';
  return ms <= MAX_DELAY_MS ? 'ok' : 'bad';
}

function runAtVerdict(value: unknown): Verdict {
  if (value === undefined) return 'ok';
  if (!(value instanceof Date) || Number.isNaN(value.getTime())) return 'bad';
  return value.getTime() >= Date.UTC(1970, 0, 1) && value.getTime() < Date.UTC(9999, 0, 1) ? 'ok' : 'bad';
}

function priorityVerdict(value: unknown): Verdict {
  return value === undefined || (Number.isInteger(value) && (value as number) >= -32768 && (value as number) <= 32767) ? 'ok' : 'bad';
}

/** A `tx`: undefined and null mean "none"; anything else that is no transaction (0, '', false included) is refused. */
function txVerdict(value: unknown): Verdict {
  return value === undefined || value === null ? 'ok' : 'bad';
}

/** Options of one generated call, and the verdict on each. */
type Verdicts = Record<string, Verdict>;

function combine(verdicts: Verdicts): { bad: string[]; either: string[] } {
  const names = Object.keys(verdicts);
  return { bad: names.filter((n) => verdicts[n] === 'bad'), either: names.filter((n) => verdicts[n] === 'either') };
}

/** `promise`'s value, or 'timeout' after `ms` (the timer cleared either way). */
async function within<T>(promise: Promise<T>, ms: number): Promise<T | 'timeout'> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), ms)));
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Runs `action`; returns its value, or the error it threw. */
async function attempt<T>(action: () => Promise<T>): Promise<{ value: T } | { error: unknown }> {
  try {
    return { value: await action() };
  } catch (error) {
    return { error };
  }
}

function describeError(error: unknown): string {
  return error instanceof Error ? `${error.constructor.name}: ${error.message}` : String(error);
}

/**
 * Asserts that `error` is the clear error for what was wrong: a
 * ValidationError (TypeError for a `tx` that is no transaction) whose message
 * names one of the wrong options, or says why the payload was refused.
 */
function assertClearError(error: unknown, wrong: { options: string[]; payload: RegExp[] }): void {
  assert.ok(error instanceof ValidationError || error instanceof TypeError, `expected a ValidationError, got ${describeError(error)}`);
  if (error instanceof TypeError) {
    assert.ok(wrong.options.includes('tx'), `a TypeError for a call whose tx is fine: ${error.message}`);
    assert.match(error.message, /^tx must be a node-postgres client inside a transaction/);
    return;
  }
  const named =
    wrong.options.some((name) => error.message.includes(name) || error.issues.some((i) => i.path === name || i.path.startsWith(`${name}.`))) ||
    wrong.payload.some((p) => p.test(error.message));
  assert.ok(named, `the error names none of the problems (options ${wrong.options.join(', ') || 'none'}, payload ${wrong.payload.join(' ') || 'fine'}): ${error.message}`);
  assert.ok(error.issues.length > 0, `a ValidationError without issues: ${error.message}`);
}

async function count(t: TestMailroom, table: 'jobs' | 'outbox'): Promise<number> {
  const [row] = await t.sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${t.schema}".${table}`);
  return row!.n;
}

/** Every job that must exist, with the payload it must have. */
class JobLedger {
  readonly expected = new Map<string, unknown>();
  constructor(private readonly t: TestMailroom) {}

  /** Records accepted ids; an id seen before (a deduplicated key) keeps its first payload. */
  accept(ids: readonly string[], stored: readonly unknown[]): void {
    ids.forEach((id, i) => {
      if (!this.expected.has(id)) this.expected.set(id, stored[i]);
    });
  }

  /** Every expected job is there with its payload, and nothing else is. */
  async assertIntact(what: string): Promise<void> {
    const rows = await this.t.sql<{ id: string; payload: unknown }>(`SELECT id, payload FROM "${this.t.schema}".jobs`);
    assert.equal(rows.length, this.expected.size, `${what}: ${rows.length} jobs in the table, ${this.expected.size} accepted`);
    for (const row of rows) {
      assert.ok(this.expected.has(row.id), `${what}: job ${row.id} was never accepted`);
      assert.deepStrictEqual(row.payload, this.expected.get(row.id), `${what}: job ${row.id}'s payload changed`);
    }
  }

  /** A worker runs every job that is due, each handler seeing the payload as accepted. */
  async drain(what: string): Promise<number> {
    const due = await this.t.sql<{ id: string }>(`SELECT id FROM "${this.t.schema}".jobs WHERE run_at <= now() AND state IN ('available', 'scheduled')`);
    const seen = new Map<string, unknown>();
    const record = (job: { id: string; data: unknown }) => {
      assert.ok(!seen.has(job.id), `${what}: job ${job.id} ran twice`);
      seen.set(job.id, job.data);
    };
    const worker = this.t.mailroom.worker({ queues: ['fuzz'], concurrency: 10, pollInterval: 20, handlers: { [plain.name]: record, [typed.name]: record, [control.name]: record } });
    await worker.start();
    try {
      await eventually(() => seen.size >= due.length, 20_000, `${what}: ${due.length} due jobs to run`);
    } finally {
      await worker.stop({ timeout: '5s' });
    }
    for (const { id } of due) assert.deepStrictEqual(seen.get(id), this.expected.get(id), `${what}: job ${id} ran with other data`);
    const unfinished = await this.t.sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${this.t.schema}".jobs WHERE state NOT IN ('completed', 'scheduled')`);
    assert.equal(unfinished[0]!.n, 0, `${what}: jobs neither completed nor scheduled`);
    return due.length;
  }
}

const enqueueOptions = fc.record(
  {
    key: optionOf(textNear(512)),
    correlationId: optionOf(textNear(512)),
    orderingKey: optionOf(textNear(512)),
    priority: optionOf(fc.integer({ min: -33_000, max: 33_000 })),
    delay: optionOf(fc.oneof(fc.nat({ max: 5 }), fc.constantFrom('1ms', '0s', ' 2 ms ', '1.5d', '36500d', '36501d', '1e3s', '-5s', '10 years', '5', 'ms', '9'.repeat(400) + 'd'))),
    runAt: optionOf(fc.date({ min: new Date(-1e14), max: new Date(3e14) })),
    tx: fc.option(wrongValue, { nil: undefined, freq: 8 }),
  },
  { requiredKeys: [] },
);

/**
 * Verdicts on enqueue options. A job that waits for a later time is kept out
 * of ordering keys (a scheduled head would hold its key past the drain).
 */
function enqueueVerdicts(options: Record<string, unknown>): Verdicts {
  return {
    key: textVerdict(options.key, 512),
    correlationId: textVerdict(options.correlationId, 512),
    // A function is enqueueMany's per-item form; enqueue takes it too.
    orderingKey: typeof options.orderingKey === 'function' ? 'either' : textVerdict(options.orderingKey, 512, 'either'),
    priority: priorityVerdict(options.priority),
    delay: delayVerdict(options.delay),
    runAt: runAtVerdict(options.runAt),
    tx: txVerdict(options.tx),
  };
}

function withoutKeyHeldByScheduledJob(options: Record<string, unknown>): Record<string, unknown> {
  if (options.delay === undefined && options.runAt === undefined) return options;
  const { orderingKey: _ignored, ...rest } = options;
  return rest;
}

/** The oracle for a typed job: the schema (zod itself) first, then the payload rules for its output. */
function typedOutcome(value: unknown): PayloadOutcome & { paths?: string[] } {
  const parsed = typedSchema.safeParse(value);
  if (!parsed.success) {
    return { ok: false, reasons: [/invalid payload: data/], paths: parsed.error.issues.map((i) => ['data', ...i.path.map(String)].join('.')) };
  }
  return payloadOutcome(parsed.data, LIMIT);
}

const NOT_DEFINITIONS: unknown[] = [undefined, null, 'fuzz.plain', 42, {}, { kind: 'event' }, [], () => 1, recorded];

for (const db of testDatabases()) {
  describe(`bad input, generated, on ${db.name}`, () => {
    test('enqueue and enqueueMany: hostile payloads and options get a clear error; good jobs stay intact and run', async () => {
      const t = await db.open({ maxPayloadBytes: LIMIT });
      const ledger = new JobLedger(t);
      const good = Array.from({ length: 5 }, (_, n) => ({ n, note: `control ${n}` }));
      ledger.accept(await t.mailroom.enqueueMany(control, good), good);

      /** One call: accepted with the predicted payload, or refused naming a real problem with nothing written. */
      const check = async (call: () => Promise<string[]>, outcomes: PayloadOutcome[], verdicts: Verdicts, options: Record<string, unknown>) => {
        const { bad, either } = combine(verdicts);
        const refusedPayload = outcomes.flatMap((o) => (o.ok ? [] : o.reasons));
        const before = await count(t, 'jobs');
        const result = await attempt(call);
        if ('error' in result) {
          assert.ok(bad.length > 0 || either.length > 0 || refusedPayload.length > 0, `a good call was refused: ${describeError(result.error)}`);
          assertClearError(result.error, { options: [...bad, ...either], payload: refusedPayload });
          assert.equal(await count(t, 'jobs'), before, `nothing written after: ${describeError(result.error)}`);
          return;
        }
        assert.deepEqual(bad, [], `accepted with wrong options ${bad.join(', ')}`);
        assert.deepEqual(refusedPayload, [], 'accepted a payload that must be refused');
        const ids = result.value;
        ledger.accept(ids, outcomes.map((o) => (o.ok ? o.stored : undefined)));
        const [row] = await t.sql<{ priority: number; correlation_id: string | null; dedup_key: string | null }>(
          `SELECT priority, correlation_id, dedup_key FROM "${t.schema}".jobs WHERE id = $1`,
          [ids[ids.length - 1]],
        );
        if (verdicts.priority === 'ok' && options.priority !== undefined) assert.equal(row!.priority, options.priority);
        if (typeof options.correlationId === 'string') assert.equal(row!.correlation_id, options.correlationId, 'correlationId stored as given');
        if (typeof options.key === 'string' && ids.length === 1) assert.equal(row!.dedup_key, options.key, 'key stored as given');
      };

      await fuzz(
        'enqueue(plain job, payload, options)',
        fc.asyncProperty(payload(LIMIT), enqueueOptions, async (data, generated) => {
          const options = withoutKeyHeldByScheduledJob(generated);
          await check(async () => [await t.mailroom.enqueue(plain, data, options as never)], [payloadOutcome(data, LIMIT)], enqueueVerdicts(options), options);
        }),
        150,
      );
      await ledger.assertIntact('after enqueue of generated payloads and options');

      await fuzz(
        'enqueue(job with a zod schema, payload)',
        fc.asyncProperty(
          fc.oneof(payload(LIMIT), fc.record({ n: fc.oneof(fc.double(), wrongValue), tags: fc.option(fc.array(anyString), { nil: undefined }), extra: payload(LIMIT) }, { requiredKeys: ['n'] })),
          async (data) => {
            const outcome = typedOutcome(data);
            const before = await count(t, 'jobs');
            const result = await attempt(() => t.mailroom.enqueue(typed, data as never));
            if ('error' in result) {
              assert.ok(!outcome.ok, `a valid payload was refused: ${describeError(result.error)}`);
              assertClearError(result.error, { options: [], payload: outcome.reasons });
              if (outcome.paths) assert.deepEqual([...(result.error as ValidationError).issues.map((i) => i.path)].sort(), [...outcome.paths].sort(), 'every failing field named');
              assert.equal(await count(t, 'jobs'), before);
            } else {
              assert.ok(outcome.ok, `accepted a payload that must be refused (${outcome.ok ? '' : outcome.reasons.join(' ')})`);
              ledger.accept([result.value], [outcome.stored]);
            }
          },
        ),
        100,
      );
      await ledger.assertIntact('after enqueue of a typed job');

      await fuzz(
        'enqueueMany(job, items, options)',
        fc.asyncProperty(
          fc.array(payload(LIMIT), { maxLength: 6 }),
          fc.array(optionOf(textNear(512)), { maxLength: 6 }),
          fc.option(fc.oneof(textNear(512), wrongValue), { nil: undefined }),
          fc.option(fc.oneof(fc.nat({ max: 3 }), wrongValue), { nil: undefined }),
          async (items, keys, orderingKey, priority) => {
            const useKeys = keys.length > 0;
            const options: Record<string, unknown> = {
              ...(useKeys ? { key: (_: unknown, i: number) => keys[i % keys.length] } : {}),
              ...(orderingKey === undefined ? {} : { orderingKey }),
              ...(priority === undefined ? {} : { priority }),
            };
            const verdicts: Verdicts = {
              key: useKeys && items.length > 0 ? (items.some((_, i) => textVerdict(keys[i % keys.length], 512) === 'bad') ? 'bad' : 'ok') : 'ok',
              orderingKey: items.length > 0 ? textVerdict(orderingKey, 512, 'either') : 'ok',
              priority: priorityVerdict(priority),
            };
            await check(() => t.mailroom.enqueueMany(plain, items, options as never), items.map((i) => payloadOutcome(i, LIMIT)), verdicts, {});
          },
        ),
        80,
      );
      await ledger.assertIntact('after enqueueMany');

      // Not a definition, not an array, not an options object.
      for (const def of NOT_DEFINITIONS) {
        const result = await attempt(() => t.mailroom.enqueue(def as never, {}));
        assert.ok('error' in result && result.error instanceof TypeError && /job definition made by defineJob/.test(result.error.message), `enqueue(${String(def)}): ${'error' in result ? describeError(result.error) : 'accepted'}`);
      }
      for (const items of [undefined, null, 'abc', { length: 2 }, 42]) {
        const result = await attempt(() => t.mailroom.enqueueMany(plain, items as never));
        assert.ok('error' in result && result.error instanceof ValidationError && /must be an array/.test(result.error.message));
      }
      for (const options of [5, 'later', true, Symbol('o')]) {
        const calls: (() => Promise<unknown>)[] = [() => t.mailroom.enqueue(plain, {}, options as never), () => t.mailroom.enqueueMany(plain, [{}], options as never)];
        for (const call of calls) {
          const result = await attempt(call);
          assert.ok('error' in result, `options ${String(options)} accepted`);
          assertClearError(result.error, { options: ['options'], payload: [] });
        }
      }
      // Every option with every wrong value of the list, not only those the generator happens to pick.
      for (const name of ['key', 'correlationId', 'orderingKey', 'priority', 'delay', 'runAt']) {
        for (const value of WRONG_CONSTANTS) {
          const options = { [name]: value };
          const verdicts = enqueueVerdicts(options);
          if (verdicts[name] !== 'bad') continue;
          const result = await attempt(() => t.mailroom.enqueue(plain, {}, options as never));
          assert.ok('error' in result, `enqueue with ${name}: ${String(value)} was accepted`);
          assertClearError(result.error, { options: [name], payload: [] });
        }
      }
      // null options mean none (as for publish).
      const one = await attempt(() => t.mailroom.enqueue(plain, { n: 1 }, null as never));
      assert.ok('value' in one, `enqueue with null options: ${'error' in one ? describeError(one.error) : ''}`);
      ledger.accept([one.value], [{ n: 1 }]);
      const many = await attempt(() => t.mailroom.enqueueMany(plain, [{ n: 2 }], null as never));
      assert.ok('value' in many, `enqueueMany with null options: ${'error' in many ? describeError(many.error) : ''}`);
      ledger.accept(many.value, [{ n: 2 }]);
      // A lone surrogate in a key, twice: refused, not looped on (it used to insert forever).
      for (let i = 0; i < 2; i++) {
        const result = await within(attempt(() => t.mailroom.enqueue(plain, {}, { key: 'k\ud800' })), 5000);
        assert.notEqual(result, 'timeout', 'enqueue with a lone surrogate in its key returned');
        assert.ok(result !== 'timeout' && 'error' in result, 'a lone surrogate in a key is refused');
        assertClearError(result.error, { options: ['key'], payload: [] });
      }
      await ledger.assertIntact('after calls with things that are not definitions, arrays or options');
      assert.ok((await ledger.drain('enqueue fuzzing')) >= good.length);
    });

    test('publish and publishMany: hostile payloads and options get a clear error; good events stay intact and reach a consumer group', async () => {
      const t = await db.open({ maxPayloadBytes: LIMIT });
      const handled = new Map<string, unknown>();
      const record = async (event: ConsumedEvent) => {
        assert.ok(!handled.has(event.id), `event ${event.id} handled twice`);
        handled.set(event.id, event.data);
      };
      const consumer = t.mailroom.consumer({ group: 'fuzzed', pollInterval: 20, handlers: { [recorded.type]: record, [checked.type]: record } });
      await consumer.start();
      const expected = new Map<string, unknown>();
      const good = Array.from({ length: 5 }, (_, n) => ({ n, note: `control ${n}` }));
      (await t.mailroom.publishMany(recorded, good)).ids.forEach((id, i) => expected.set(id, good[i]));

      const options = fc.record(
        {
          key: optionOf(textNear(256)),
          correlationId: optionOf(textNear(256)),
          causationId: optionOf(textNear(256)),
          traceparent: optionOf(fc.oneof(fc.constant('00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'), fc.constant('ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'), fc.constant('00-00000000000000000000000000000000-b7ad6b7169203331-01'), fc.stringMatching(/^[0-9a-fA-F]{2}-[0-9a-f]{30,33}-[0-9a-f]{16}-[0-9a-f]{2}$/))),
          headers: optionOf(fc.dictionary(fc.oneof(fc.stringMatching(/^[a-z0-9]{1,21}$/), anyString, fc.constantFrom('id', 'type', 'data', 'traceparent')), fc.oneof(textNear(1024), wrongValue), { maxKeys: 22 })),
          time: optionOf(fc.date({ min: new Date(-1e14), max: new Date(3e14) })),
          tx: fc.option(wrongValue, { nil: undefined, freq: 8 }),
        },
        { requiredKeys: [] },
      );
      const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$/;
      const verdicts = (o: Record<string, unknown>): Verdicts => {
        const match = typeof o.traceparent === 'string' ? TRACEPARENT.exec(o.traceparent) : null;
        const headers = o.headers;
        let headersVerdict: Verdict = 'ok';
        if (headers !== undefined && headers !== null) {
          if (typeof headers !== 'object' || Array.isArray(headers)) headersVerdict = 'bad';
          else if (Object.getPrototypeOf(headers) !== Object.prototype && Object.getPrototypeOf(headers) !== null) headersVerdict = 'bad'; // a Map, a Date...: refused, not read as empty
          else {
            const entries = Object.entries(headers);
            const reserved = ['specversion', 'id', 'source', 'type', 'time', 'datacontenttype', 'dataschema', 'subject', 'data', 'data_base64', 'partitionkey', 'correlationid', 'causationid', 'traceparent', 'tracestate'];
            headersVerdict = entries.length > 20 || entries.some(([k, v]) => !/^[a-z0-9]{1,20}$/.test(k) || reserved.includes(k) || textVerdict(v, 1024) !== 'ok') ? 'bad' : 'ok';
          }
        }
        return {
          key: typeof o.key === 'function' ? 'either' : textVerdict(o.key, 256), // a function: publishMany's per-item form
          correlationId: textVerdict(o.correlationId, 256),
          causationId: textVerdict(o.causationId, 256),
          traceparent: o.traceparent === undefined || o.traceparent === null ? 'ok' : match && match[1] !== 'ff' && !/^0+$/.test(match[2]!) && !/^0+$/.test(match[3]!) ? 'ok' : 'bad',
          headers: headersVerdict,
          time: o.time === undefined ? 'ok' : o.time instanceof Date && !Number.isNaN(o.time.getTime()) && o.time.getUTCFullYear() >= 1970 && o.time.getUTCFullYear() <= 9999 ? 'ok' : 'bad',
          tx: txVerdict(o.tx),
        };
      };
      const check = async (call: () => Promise<string[]>, outcomes: PayloadOutcome[], v: Verdicts) => {
        const { bad, either } = combine(v);
        const refusedPayload = outcomes.flatMap((o) => (o.ok ? [] : o.reasons));
        const before = await count(t, 'outbox');
        const result = await attempt(call);
        if ('error' in result) {
          assert.ok(bad.length > 0 || either.length > 0 || refusedPayload.length > 0, `a good publish was refused: ${describeError(result.error)}`);
          assertClearError(result.error, { options: [...bad, ...either], payload: refusedPayload });
          assert.equal(await count(t, 'outbox'), before, `nothing written after: ${describeError(result.error)}`);
          return;
        }
        assert.deepEqual(bad, [], `accepted with wrong options ${bad.join(', ')}`);
        assert.deepEqual(refusedPayload, [], 'accepted a payload that must be refused');
        result.value.forEach((id, i) => expected.set(id, (outcomes[i] as { stored: unknown }).stored));
      };

      await fuzz(
        'publish(event, payload, options)',
        fc.asyncProperty(payload(LIMIT), options, async (data, o) => {
          await check(async () => [(await t.mailroom.publish(recorded, data, o as never)).id], [payloadOutcome(data, LIMIT)], verdicts(o));
        }),
        120,
      );
      await fuzz(
        'publishMany(event with a zod schema, items, options)',
        fc.asyncProperty(
          fc.array(fc.oneof(payload(LIMIT), fc.record({ n: fc.oneof(fc.double(), wrongValue), extra: payload(LIMIT) }, { requiredKeys: ['n'] })), { maxLength: 4 }),
          options,
          async (items, o) => {
            const outcomes = items.map(typedOutcome);
            const v = verdicts(o);
            // Nothing to write: a key or tx that is never used may go unchecked.
            if (items.length === 0) for (const name of ['key', 'tx']) if (v[name] === 'bad') v[name] = 'either';
            await check(async () => (await t.mailroom.publishMany(checked, items as never, o as never)).ids, outcomes, v);
          },
        ),
        60,
      );
      for (const name of ['key', 'correlationId', 'causationId', 'traceparent', 'headers', 'time']) {
        for (const value of WRONG_CONSTANTS) {
          const o = { [name]: value };
          if (verdicts(o)[name] !== 'bad') continue;
          const result = await attempt(() => t.mailroom.publish(recorded, {}, o as never));
          assert.ok('error' in result, `publish with ${name}: ${String(value)} was accepted`);
          assertClearError(result.error, { options: [name], payload: [] });
        }
      }
      // A lone surrogate in a header value used to reach jsonb and fail there with a raw database error.
      const halfEmoji = await attempt(() => t.mailroom.publish(recorded, {}, { headers: { tenant: 'v\ud800' } }));
      assert.ok('error' in halfEmoji, 'a lone surrogate in a header value is refused');
      assertClearError(halfEmoji.error, { options: ['headers'], payload: [] });
      for (const def of NOT_DEFINITIONS.filter((d) => d !== recorded)) {
        const result = await attempt(() => t.mailroom.publish(def as never, {}));
        assert.ok('error' in result && result.error instanceof TypeError && /event definition made by defineEvent/.test(result.error.message), `publish(${String(def)}): ${'error' in result ? describeError(result.error) : 'accepted'}`);
      }
      const rows = await t.sql<{ id: string; data: unknown }>(`SELECT id, data FROM "${t.schema}".outbox`);
      assert.equal(rows.length, expected.size, 'outbox rows: exactly the accepted events');
      for (const row of rows) assert.deepStrictEqual(row.data, expected.get(row.id), `event ${row.id}'s data changed`);
      const relay = t.mailroom.relay();
      await flushUntil(relay, expected.size, 'internal', 20_000, t.mailroom);
      await eventually(() => handled.size >= expected.size, 20_000, `${expected.size} events handled by the consumer group`);
      for (const [id, data] of expected) assert.deepStrictEqual(handled.get(id), data, `event ${id} reached the consumer with other data`);
      await consumer.stop();
    });

    test('CloudEvents from a broker: every message ends as a job of the group or a validation / unknown-type dead letter, acked once', async () => {
      const t = await db.open();
      const MAX_MESSAGE = 2048;
      const source = scriptedSource('fuzzbroker');
      const handled = new Map<string, number>();
      const consumer = t.mailroom.consumer({
        group: 'fuzzed-broker',
        source,
        pollInterval: 20,
        maxMessageBytes: MAX_MESSAGE,
        handlers: { [arrived.type]: async (event: ConsumedEvent) => void handled.set(event.id, (handled.get(event.id) ?? 0) + 1) },
      });
      const errors: unknown[] = [];
      consumer.on('error', (error) => errors.push(error));
      await consumer.start();
      let seq = 0;
      type Expect = 'job' | 'unknown-type' | 'validation';
      const sent: { messageId: string; expect: Expect; id?: string; body: string }[] = [];

      const event = (id: string, extra: Record<string, unknown> = {}) => ({ specversion: '1.0', id, source: 'https://fuzz.example/orders', type: arrived.type, data: { n: 1 }, ...extra });
      type Message = { body: string | Uint8Array; headers: Record<string, string>; expect: Expect; id?: string };
      const message: fc.Arbitrary<Message> = fc.oneof<fc.Arbitrary<Message>[]>(
        // Good ones: structured, with any JSON data and odd but valid extras; binary mode with any content type.
        fc.record({ data: fc.jsonValue({ maxDepth: 2 }), subject: fc.option(fc.string(), { nil: undefined }) }).map(({ data, subject }) => {
          const id = `good-${++seq}`;
          const body = JSON.stringify(event(id, { data, ...(subject ? { subject } : {}) }));
          return { body, headers: {}, expect: (Buffer.byteLength(body) > MAX_MESSAGE || body.includes('\\u0000') || hasLoneSurrogate(JSON.parse(body) as never) ? 'validation' : 'job') as Expect, id };
        }),
        fc.tuple(fc.string(), fc.constantFrom('text/plain', 'application/octet-stream', 'application/x+json; charset=utf-8', 'text/json', 'Application/JSON')).map(([body, contentType]) => {
          const id = `binary-${++seq}`;
          const json = /json/i.test(contentType);
          let expect: Expect = 'job';
          if (json) {
            try {
              JSON.parse(body);
            } catch {
              expect = body.length === 0 ? 'job' : 'validation';
            }
          }
          if (body.includes('\u0000')) expect = 'validation';
          return { body, headers: { 'CE-SpecVersion': '1.0', 'ce-id': id, 'ce-source': '/fuzz', 'ce-type': arrived.type, 'content-type': contentType }, expect, id };
        }),
        fc.constant(null).map(() => {
          const id = `stranger-${++seq}`;
          return { body: JSON.stringify(event(id, { type: stranger.type })), headers: {}, expect: 'unknown-type' as Expect, id };
        }),
        // Bad ones.
        fc.nat({ max: 200 }).map((cut) => {
          const body = JSON.stringify(event(`cut-${++seq}`));
          return { body: body.slice(0, Math.min(cut, body.length - 1)), headers: {}, expect: 'validation' as Expect };
        }),
        fc.jsonValue().filter((v) => typeof v !== 'object' || v === null || Array.isArray(v)).map((v) => ({ body: JSON.stringify(v), headers: {}, expect: 'validation' as Expect })),
        fc.tuple(fc.constantFrom('specversion', 'id', 'source', 'type'), fc.oneof(fc.constant(undefined), fc.constant(''), wrongValue.filter((v) => typeof v !== 'string')), fc.constant(null)).map(([field, value]) => {
          const e: Record<string, unknown> = event(`field-${++seq}`);
          if (value === undefined) delete e[field];
          else e[field] = value;
          const body = JSON.stringify(e, (_k, v: unknown) => (typeof v === 'bigint' || typeof v === 'symbol' || typeof v === 'function' ? 42 : v));
          return { body, headers: {}, expect: 'validation' as Expect };
        }),
        fc
          .constantFrom<[string, unknown]>(['time', 12345], ['time', 'yesterday'], ['time', {}], ['subject', 12345], ['subject', []], ['partitionkey', {}], ['correlationid', true], ['causationid', 7], ['traceparent', []], ['dataschema', 'urn:mailroom:wrong'], ['dataschema', 12])
          .map(([field, value]) => ({ body: JSON.stringify(event(`typed-${++seq}`, { [field]: value })), headers: {}, expect: 'validation' as Expect })),
        fc.oneof(fc.string(), fc.constantFrom('0.3', '1', '1.0.0', ' 1.0', '2.0')).filter((v) => v !== '1.0').map((specversion) => ({ body: JSON.stringify(event(`spec-${++seq}`, { specversion })), headers: {}, expect: 'validation' as Expect })),
        fc.integer({ min: MAX_MESSAGE - 100, max: MAX_MESSAGE * 3 }).map((n) => {
          const body = JSON.stringify(event(`huge-${++seq}`, { data: 'x'.repeat(n) }));
          return { body, headers: {}, expect: (Buffer.byteLength(body) > MAX_MESSAGE ? 'validation' : 'job') as Expect, id: `huge-${seq}` };
        }),
        fc.uint8Array({ minLength: 0, maxLength: 300 }).map((bytes) => ({ body: bytes, headers: {}, expect: 'validation' as Expect })),
        fc.constantFrom('"\\u0000"', '"\\ud800"', 'x'.repeat(1025)).map((bad) => ({ body: JSON.stringify(event(`nul-${++seq}`)).replace('"data":{"n":1}', `"data":${bad.startsWith('"') ? bad : `"${bad}"`}`).replace(`"id":"nul-${seq}"`, bad.length > 1000 ? `"id":"${bad}"` : `"id":"nul-${seq}"`), headers: {}, expect: 'validation' as Expect })),
        fc.tuple(fc.constantFrom('0.3', '1.0'), fc.constantFrom<[string, string]>(['ce-time', 'yesterday'], ['ce-id', ''], ['ce-type', ''], ['ce-dataschema', 'urn:mailroom:other:v1'], ['ce-source', '']), fc.constant(null)).map(([specversion, [name, value]]) => ({
          body: '{}',
          headers: { 'ce-specversion': specversion, 'ce-id': `bin-${++seq}`, 'ce-source': '/fuzz', 'ce-type': arrived.type, 'content-type': 'application/json', [name]: value },
          expect: 'validation' as Expect,
        })),
      );

      await fuzz(
        'broker messages',
        fc.asyncProperty(fc.array(fc.tuple(message, fc.boolean()), { minLength: 1, maxLength: 8 }), async (batch) => {
          const pushes: Promise<'ack' | 'nack'>[] = [];
          for (const [m, redeliver] of batch) {
            const messageId = `m-${++seq}`;
            sent.push({ messageId, expect: m.expect, ...(m.id ? { id: m.id } : {}), body: `${JSON.stringify(m.headers)} ${typeof m.body === 'string' ? m.body.slice(0, 200) : `${m.body.byteLength} bytes`}` });
            pushes.push(source.push(m.body, { messageId, headers: m.headers }));
            if (redeliver) pushes.push(source.push(m.body, { messageId, headers: m.headers }));
          }
          const settled = await within(Promise.all(pushes), 10_000);
          assert.notEqual(settled, 'timeout', 'every message settled within 10 s');
          assert.deepEqual([...new Set(settled as string[])], ['ack'], 'every message acked, none given back');
          assert.deepEqual(errors.map(String), [], 'no errors (a message settled twice would be one)');
        }),
        40,
      );

      const rows = await t.sql<{ type: string; state: string; dead_reason: string | null; last_error: { category: string } | null; payload: Record<string, unknown> }>(
        `SELECT type, state, dead_reason, last_error, payload FROM "${t.schema}".jobs WHERE queue = 'consumer.fuzzed-broker'`,
      );
      assert.equal(rows.length, sent.length, 'one row per message, redeliveries included in none');
      const byMessage = new Map(rows.filter((r) => typeof r.payload.messageId === 'string').map((r) => [r.payload.messageId as string, r]));
      const byEvent = new Map(rows.filter((r) => typeof r.payload.id === 'string').map((r) => [r.payload.id as string, r]));
      for (const m of sent) {
        if (m.expect === 'validation') {
          const row = byMessage.get(m.messageId);
          assert.ok(row, `message ${m.messageId} (invalid) has no dead letter: ${m.body}`);
          assert.deepEqual([row.state, row.dead_reason, row.last_error?.category], ['dead', 'validation', 'validation']);
        } else {
          const row = byEvent.get(m.id!);
          assert.ok(row, `event ${m.id} was not stored: ${JSON.stringify(byMessage.get(m.messageId)?.payload ?? null).slice(0, 300)}`);
          if (m.expect === 'unknown-type') assert.deepEqual([row.state, row.dead_reason], ['dead', 'unknown-type']);
          else assert.notEqual(row.state, 'dead');
        }
      }
      const jobs = sent.filter((m) => m.expect === 'job');
      await eventually(() => jobs.every((m) => handled.has(m.id!)), 20_000, `${jobs.length} good events handled`);
      for (const m of jobs) assert.equal(handled.get(m.id!), 1, `event ${m.id} handled once`);
      await consumer.stop();
    });
  });
}
