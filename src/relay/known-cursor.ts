/**
 * A read-ahead target's cursor as its relay last read or advanced it. While
 * the lease renewed with it has at least half its time left, no other relay
 * can take the lease (nor so move the cursor), so the next round reads past it
 * in one statement instead of a transaction that reads the cursor and renews
 * the lease. The cursor's advance after the publish is fenced by the token
 * either way; a round that fails or loses the lease forgets it.
 */
import type { OutboxPoint } from './read-batch.ts';

/** A cursor read or advanced under `token`, and when the statement that renewed the lease with it was sent. */
export interface KnownCursor {
  cursor: OutboxPoint;
  token: string;
  renewedAt: number;
}

/**
 * The cursor to read past without asking the database, or null: the known one while it was set under
 * `token` less than half a lease before `now`.
 *
 * @example
 * const from = knownCursorStillHeld(s.known, token, Date.now(), 30_000); // null: read it in a transaction
 */
export function knownCursorStillHeld(known: KnownCursor | null, token: string, now: number, leaseMs: number): OutboxPoint | null {
  return known !== null && known.token === token && now - known.renewedAt < leaseMs / 2 ? known.cursor : null;
}
