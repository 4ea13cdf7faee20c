/**
 * The Idempotency-Key header's value: a Structured Fields string
 * (`"8e03978e-…"`), or, as many clients send it, the bare text.
 */

const MAX_KEY_LENGTH = 255;
const PRINTABLE = /^[\x20-\x7e]+$/;

/** The key, or why it cannot be one (for a 400 answer). */
export function parseIdempotencyKey(header: string | string[]): string | { problem: string } {
  if (Array.isArray(header)) return { problem: 'The request carries more than one Idempotency-Key header; send one.' };
  let key = header.trim();
  if (key.startsWith('"')) {
    if (key.length < 2 || !key.endsWith('"')) return { problem: 'The Idempotency-Key header opens a quoted string that it does not close.' };
    key = key.slice(1, -1).replace(/\\(["\\])/g, '$1');
  }
  if (key.length === 0) return { problem: 'The Idempotency-Key header is empty; send a unique string per operation, e.g. a UUID.' };
  if (key.length > MAX_KEY_LENGTH) return { problem: `The Idempotency-Key is ${key.length} characters long; at most ${MAX_KEY_LENGTH} are taken.` };
  if (!PRINTABLE.test(key)) return { problem: 'The Idempotency-Key holds characters other than printable ASCII.' };
  return key;
}
