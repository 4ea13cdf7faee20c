/**
 * The page cursor of `deadLetters.list`: opaque to callers, it holds the last
 * item's death time (to the microsecond, as PostgreSQL keeps it) and id, the
 * key the list is ordered by, so the next page starts right after it: no gap
 * and no repeat, however the queue changes between pages.
 */
import { ValidationError } from '../errors.ts';
import { isUuid } from '../ids.ts';

/** Where a page ends. */
export interface PagePosition {
  /** `finished_at` as UTC text with microseconds. */
  diedAt: string;
  id: string;
}

const EXACT_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$/;

/** Encodes a position as the opaque `next` string. */
export function encodeCursor(position: PagePosition): string {
  return Buffer.from(JSON.stringify([position.diedAt, position.id])).toString('base64url');
}

/** Decodes a `next` string from a previous page; a cursor that is not one is a ValidationError saying what to pass. */
export function decodeCursor(cursor: unknown): PagePosition {
  const bad = () =>
    new ValidationError(
      'dead-letter list: cursor is not a cursor this list returned; pass the `next` of a previous page unchanged, or leave it out for the first page',
      [{ path: 'cursor', message: 'not a cursor' }],
    );
  if (typeof cursor !== 'string' || cursor === '') throw bad();
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
  } catch {
    throw bad();
  }
  if (!Array.isArray(parsed) || parsed.length !== 2) throw bad();
  const [diedAt, id] = parsed as unknown[];
  if (typeof diedAt !== 'string' || !EXACT_TIME.test(diedAt) || !isUuid(id)) throw bad();
  return { diedAt, id };
}
