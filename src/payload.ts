import type { StandardSchemaV1 } from '@standard-schema/spec';
import { ValidationError } from './errors.ts';

/**
 * An escape JSON.stringify writes for a character jsonb refuses: NUL, or a lone
 * surrogate (paired ones are written as is). Only a real escape counts: one not
 * preceded by an odd number of backslashes (the text `\\u0000` is fine).
 */
const UNSTORABLE_ESCAPE = /(?<!\\)(?:\\\\)*\\u(0000|d[89a-f][0-9a-f]{2})/;

/** A UTF-16 surrogate without its other half: PostgreSQL text would hold U+FFFD instead, so two such keys would collide. */
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** What a key, id or header value with a lone surrogate is told: the fix, for enqueue's and publish's errors. */
export const LONE_SURROGATE_FIX = 'holds a lone UTF-16 surrogate (e.g. text cut in the middle of an emoji), which PostgreSQL cannot store; fix the string';

/**
 * True when `text` holds a UTF-16 surrogate without its other half (not valid
 * Unicode): refused in keys, ids and header values.
 *
 * @example
 * hasLoneSurrogate('half \ud83d'); // true
 */
export function hasLoneSurrogate(text: string): boolean {
  return LONE_SURROGATE.test(text);
}

/** Default limit on a serialised payload: 1 MiB. */
export const DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024;

/**
 * Serialises a payload to JSON text for a `jsonb` column, refusing what JSON
 * cannot carry faithfully (BigInt, cycles, `\u0000`, lone surrogates) and anything over
 * `maxBytes`, with an error that says which and how to fix it.
 *
 * @example
 * serializePayload({ to: 'a@example.com' }, 1024, 'email.welcome') // '{"to":"a@example.com"}'
 */
export function serializePayload(data: unknown, maxBytes: number, what: string): string {
  let text: string | undefined;
  try {
    text = JSON.stringify(data === undefined ? null : data);
  } catch (err) {
    const reason = err instanceof Error ? err.message : String(err);
    const hint = /bigint/i.test(reason)
      ? 'convert BigInt values to strings or numbers first'
      : /circular|cyclic/i.test(reason)
        ? 'remove the circular reference'
        : 'pass plain JSON data';
    throw new ValidationError(`${what}: the payload is not JSON-serialisable (${reason}); ${hint}`, [
      { path: 'data', message: reason },
    ]);
  }
  if (text === undefined) {
    throw new ValidationError(`${what}: the payload is not JSON-serialisable (a function or symbol); pass plain JSON data`, [
      { path: 'data', message: 'not JSON' },
    ]);
  }
  const unstorable = UNSTORABLE_ESCAPE.exec(text);
  if (unstorable?.[1] === '0000') {
    throw new ValidationError(`${what}: the payload contains a NUL character (\\u0000), which PostgreSQL jsonb cannot store; remove it or encode the value`, [
      { path: 'data', message: 'contains \\u0000' },
    ]);
  }
  if (unstorable) {
    throw new ValidationError(
      `${what}: the payload contains a lone UTF-16 surrogate (\\u${unstorable[1]}), which is not valid Unicode and PostgreSQL jsonb cannot store; fix the string (e.g. text cut in the middle of an emoji) or encode the value`,
      [{ path: 'data', message: `contains \\u${unstorable[1]}` }],
    );
  }
  const bytes = Buffer.byteLength(text, 'utf8');
  if (bytes > maxBytes) {
    throw new ValidationError(
      `${what}: the payload is ${bytes} bytes, over the limit of ${maxBytes} bytes (maxPayloadBytes); store large data elsewhere and enqueue a reference, or raise maxPayloadBytes`,
      [{ path: 'data', message: `over ${maxBytes} bytes` }],
    );
  }
  return text;
}

function pathToString(path: StandardSchemaV1.Issue['path']): string {
  if (!path || path.length === 0) return 'data';
  return ['data', ...path.map((p) => (typeof p === 'object' && p !== null ? String(p.key) : String(p)))].join('.');
}

/**
 * Runs a Standard Schema validator (zod, valibot, arktype, ...) and returns the
 * validated (possibly transformed) value, or throws a ValidationError whose
 * message names every failing field.
 *
 * @example
 * const value = await validatePayload(z.object({ email: z.email() }), input, 'email.welcome');
 */
export async function validatePayload<T>(schema: StandardSchemaV1<unknown, T> | undefined, data: unknown, what: string): Promise<T> {
  if (!schema) return data as T;
  let result = schema['~standard'].validate(data);
  if (result instanceof Promise) result = await result;
  if (result.issues) {
    const issues = result.issues.map((issue) => ({ path: pathToString(issue.path), message: issue.message }));
    const list = issues.map((i) => `${i.path}: ${i.message}`).join('; ');
    throw new ValidationError(`${what}: invalid payload: ${list}`, issues);
  }
  return result.value;
}
