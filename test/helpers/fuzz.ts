/**
 * Shared pieces of the bad-input fuzzing (test/fuzz.test.ts): the seed and
 * run counts, the hostile-value arbitraries, and the independent oracles that
 * say what mailroom must do with a generated value.
 *
 * A failing property reports its seed and shrunk counterexample; run again
 * with `MAILROOM_FUZZ_SEED=<seed>` to reproduce it. `MAILROOM_FUZZ_RUNS=<n>`
 * runs every property n times (a longer local session).
 */
import fc from 'fast-check';

/** The seed every property runs with: fixed, so a CI failure reproduces locally. */
export const SEED = Number(process.env.MAILROOM_FUZZ_SEED ?? 20_250_808);

/** Runs of a property: its default, or MAILROOM_FUZZ_RUNS when set. */
export function runs(fallback: number): number {
  const n = Number(process.env.MAILROOM_FUZZ_RUNS);
  return Number.isSafeInteger(n) && n > 0 ? n : fallback;
}

/**
 * Checks `property` with the fixed seed; a failure names the property, the
 * seed and the command that reproduces it.
 */
export async function fuzz<Ts extends [unknown, ...unknown[]]>(name: string, property: fc.IAsyncPropertyWithHooks<Ts>, numRuns: number): Promise<void> {
  try {
    await fc.assert(property, { seed: SEED, numRuns: runs(numRuns) });
  } catch (error) {
    if (error instanceof Error) {
      const cause = error.cause instanceof Error ? `\ncause: ${error.cause.message}` : '';
      error.message = `${name}: ${error.message}${cause}\nreproduce: MAILROOM_FUZZ_SEED=${SEED} node --import tsx --test test/fuzz.test.ts`;
    }
    throw error;
  }
}

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** True when `text` holds a UTF-16 surrogate without its other half (not valid Unicode). */
export function hasLoneSurrogate(text: string): boolean {
  return LONE_SURROGATE.test(text);
}

/** Strings meant to break things: NUL, lone surrogates, escapes that look like them, prototype names, SQL. */
export const NASTY_STRINGS = [
  '', ' ', '\u0000', 'a\u0000b', '\ud800', 'x\udfff', 'half \ud83d', '\ud83d\ude00', '\\u0000', '\\ud800', '__proto__', 'constructor',
  'prototype', 'toString', `'; DROP TABLE jobs; --`, '"', '\\', '\n', '\r\n', '\u2028', '\ufeff', '\uffff', 'é', '😀',
];

/** Any string, including lone surrogates and control characters. */
export const anyString = fc.oneof(fc.string(), fc.string({ unit: 'binary' }), fc.constantFrom(...NASTY_STRINGS));

/** Values that are wrong for nearly every option: other types, special numbers, odd objects. */
export const WRONG_CONSTANTS: readonly unknown[] = [
  null, Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, -1, -0, 1.5, 2 ** 53, -(2 ** 31), 1e21, true, false,
  [], {}, [1], new Date(Number.NaN), new Date(-8.64e15), new Date(Date.UTC(10_000, 0, 1)), 10n, Symbol('option'), () => 'fn',
  new Map(), new Uint8Array(2), 'x'.repeat(600), '\u0000', '\ud800', 'k\udc00', '',
];

/** A value that is wrong for nearly every option: one of {@link WRONG_CONSTANTS} or anything else. */
export const wrongValue: fc.Arbitrary<unknown> = fc.oneof(
  fc.constantFrom<unknown>(...WRONG_CONSTANTS),
  fc.anything({ maxDepth: 2 }),
  anyString,
  fc.integer(),
  fc.double(),
);

/** Deep nesting: arrays or objects `depth` levels down. */
const deeplyNested = fc.tuple(fc.integer({ min: 50, max: 8000 }), fc.boolean()).map(([depth, asObject]) => {
  let value: unknown = 'bottom';
  for (let i = 0; i < depth; i++) value = asObject ? { d: value } : [value];
  // fast-check's own report would recurse as deep: describe it instead.
  Object.defineProperty(value, fc.toStringMethod, { value: () => `${asObject ? 'objects' : 'arrays'} nested ${depth} deep`, enumerable: false });
  return value;
});

/** Strings of `limit` ± 64 bytes inside an object, in 1-, 2- and 4-byte characters. */
export function nearLimit(limit: number): fc.Arbitrary<unknown> {
  return fc.tuple(fc.integer({ min: -64, max: 64 }), fc.constantFrom('x', 'é', '😀')).map(([delta, char]) => {
    const overhead = JSON.stringify({ blob: '' }).length;
    const bytes = Math.max(0, limit - overhead + delta);
    const width = Buffer.byteLength(char);
    return { blob: char.repeat(Math.floor(bytes / width)) + 'x'.repeat(bytes % width) };
  });
}

/** Values JSON cannot carry, or carries differently: cycles, BigInt, functions, symbols, throwing toJSON, `__proto__` keys. */
const special = fc.constantFrom<() => unknown>(
  () => {
    const cycle: Record<string, unknown> = { name: 'loop' };
    cycle.self = cycle;
    return cycle;
  },
  () => ({ amount: 10n }),
  () => () => 'fn',
  () => Symbol('payload'),
  () => ({ s: Symbol('inside') }),
  () => ({ toJSON: () => { throw new Error('toJSON refuses'); } }),
  () => JSON.parse('{"__proto__": {"polluted": true}, "constructor": {"prototype": 1}}') as unknown,
  () => new Date(Number.NaN),
  () => new Date(0),
  () => new Float64Array([Number.NaN, 1.5]),
  () => new Map([['a', 1]]),
  () => Object.create(null) as unknown,
  () => undefined,
  () => [undefined, () => 1, Symbol('x')],
  () => Number.NaN,
  () => ({ [String.fromCharCode(0)]: 1 }),
  () => ({ ['\ud800']: 'key is half an emoji' }),
);

/** Payloads: anything fast-check can make (with strings holding NUL and lone surrogates), deep nesting, sizes near `limit`, specials. */
export function payload(limit: number): fc.Arbitrary<unknown> {
  return fc.oneof(
    { weight: 4, arbitrary: fc.anything({ key: anyString, values: [anyString, fc.double(), fc.integer(), fc.boolean(), fc.constant(null)], maxDepth: 3, withBigInt: true, withBoxedValues: true, withDate: true, withMap: true, withSet: true, withObjectString: true, withNullPrototype: true, withTypedArray: true, withSparseArray: true }) },
    { weight: 3, arbitrary: fc.jsonValue({ maxDepth: 3 }) },
    { weight: 1, arbitrary: deeplyNested },
    { weight: 2, arbitrary: nearLimit(limit) },
    { weight: 2, arbitrary: special.map((make) => make()) },
  );
}

/** What mailroom must do with a payload: store exactly `stored`, or refuse for one of `reasons`. */
export type PayloadOutcome = { ok: true; stored: unknown } | { ok: false; reasons: RegExp[] };

/** Whether a string or key anywhere in parsed JSON is `bad` (walked without recursion: payloads nest thousands deep). */
function someText(root: unknown, bad: (text: string) => boolean): boolean {
  const stack: unknown[] = [root];
  while (stack.length > 0) {
    const value = stack.pop();
    if (typeof value === 'string') {
      if (bad(value)) return true;
    } else if (Array.isArray(value)) stack.push(...value);
    else if (typeof value === 'object' && value !== null) {
      for (const [k, v] of Object.entries(value)) {
        if (bad(k)) return true;
        stack.push(v);
      }
    }
  }
  return false;
}

/**
 * The oracle for payloads, from JSON itself rather than mailroom's code: what
 * JSON.stringify cannot write is refused, then text jsonb cannot store (NUL,
 * lone surrogates, in values or keys), then anything over `maxBytes`.
 */
export function payloadOutcome(value: unknown, maxBytes: number): PayloadOutcome {
  let text: string | undefined;
  try {
    text = JSON.stringify(value === undefined ? null : value);
  } catch {
    return { ok: false, reasons: [/not JSON-serialisable/] };
  }
  if (text === undefined) return { ok: false, reasons: [/not JSON-serialisable/] };
  const parsed = JSON.parse(text) as unknown;
  const reasons: RegExp[] = [];
  if (someText(parsed, (s) => s.includes('\u0000'))) reasons.push(/NUL character \(\\u0000\), which PostgreSQL jsonb cannot store/);
  if (someText(parsed, hasLoneSurrogate)) reasons.push(/lone UTF-16 surrogate .* fix the string/);
  if (reasons.length > 0) return { ok: false, reasons };
  const bytes = Buffer.byteLength(text);
  if (bytes > maxBytes) return { ok: false, reasons: [new RegExp(`payload is ${bytes} bytes, over the limit of ${maxBytes} bytes \\(maxPayloadBytes\\)`)] };
  return { ok: true, stored: parsed };
}

/** Whether an option value must be accepted, refused, or may go either way (a lenient reading is fine). */
export type Verdict = 'ok' | 'bad' | 'either';

/** A text option (key, ids): 1 to `max` characters, no NUL, no lone surrogate; null and undefined mean none. */
export function textVerdict(value: unknown, max: number, nullIs: Verdict = 'ok'): Verdict {
  if (value === undefined) return 'ok';
  if (value === null) return nullIs;
  return typeof value === 'string' && value.length > 0 && value.length <= max && !value.includes('\u0000') && !hasLoneSurrogate(value) ? 'ok' : 'bad';
}

/** A value of `arb` or, as often, a wrong one, or the option left out. */
export function optionOf<T>(arb: fc.Arbitrary<T>): fc.Arbitrary<unknown> {
  return fc.option(fc.oneof(arb, wrongValue), { nil: undefined, freq: 3 });
}

/** Keys-and-ids as a user would write them, near the length limits. */
export function textNear(max: number): fc.Arbitrary<string> {
  return fc.oneof(
    fc.string({ minLength: 1, maxLength: 24 }),
    anyString,
    fc.integer({ min: max - 2, max: max + 2 }).map((n) => 'k'.repeat(Math.max(0, n))),
  );
}
