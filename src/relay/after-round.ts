/**
 * What a relay does after a round that found nothing more to deliver: looks
 * past the cursor with a fresh fence (deliverable now, held back behind an
 * open transaction, or idle), reports a hold (at most every 10 s), and stops
 * itself from spinning on rounds that find events and deliver none.
 */
import { MailroomError } from '../errors.ts';
import { findHolder } from './held-back.ts';
import type { DoneRound, RoundHost, TargetState } from './round-state.ts';

const HELD_BACK_REPORT_MS = 10_000;
/** Rounds in a row that found events deliverable yet delivered none: past this, a relay stops and says so instead of spinning. */
export const MAX_EMPTY_AGAIN = 100;

/**
 * After a round that found nothing more to deliver, with a fence read now:
 * `'again'` when rows committed meanwhile are deliverable (the round's fence
 * was older than they are), `'held-back'` when committed rows wait behind an
 * open transaction (reported, at most every 10 s), else `'idle'`.
 */
export async function afterRound(host: RoundHost, s: TargetState, round: DoneRound): Promise<'again' | 'held-back' | 'idle'> {
  const { db, queries } = host;
  const cursor = [String(round.cursor.xid), String(round.cursor.position)];
  const { rows } = await db.run<{ fence: string; ready: boolean; waiting: boolean }>(queries.afterCursor, cursor);
  const fence = BigInt(rows[0]!.fence);
  const { ready, waiting } = rows[0]!;
  // Deliverable now: rows that arrived below the new fence, or the row a round had to stop before.
  if (round.blockedBy !== null ? round.blockedBy < fence : ready && fence > round.fence) return 'again';
  if (!waiting && round.blockedBy === null) {
    s.heldBackSince = null;
    return 'idle';
  }
  const now = Date.now();
  s.heldBackSince ??= now;
  if (now - s.lastHeldBackReport >= HELD_BACK_REPORT_MS) {
    s.lastHeldBackReport = now;
    const heldBackBy = await findHolder(db, queries, fence);
    const count = (await db.run<{ count: number }>(queries.pastCursor, cursor)).rows[0]!.count;
    if (!host.tell('held-back', { target: s.target.name, waiting: count, heldBackBy })) {
      const who = heldBackBy.pid === null ? `transaction ${heldBackBy.xid}` : `pid ${heldBackBy.pid} (open ${heldBackBy.ageSeconds}s)`;
      console.warn(`[mailroom] relay ${host.id}: ${count} committed event(s) for ${s.target.name} wait behind an open transaction: ${who}`);
    }
  }
  return 'held-back';
}

/**
 * Counts a round after which events were found deliverable: true (reported,
 * and the count started over) once {@link MAX_EMPTY_AGAIN} such rounds in a
 * row delivered nothing, so the caller stops looking at once.
 */
export function stalled(host: RoundHost, s: TargetState, round: DoneRound): boolean {
  s.emptyAgain = round.delivered > 0 ? 0 : s.emptyAgain + 1;
  if (s.emptyAgain < MAX_EMPTY_AGAIN) return false;
  s.emptyAgain = 0;
  host.report(
    new MailroomError(
      `relay ${host.id}: target ${s.target.name} found events deliverable ${MAX_EMPTY_AGAIN} times in a row and delivered none; ` +
        'it waits for its next poll instead of looking again at once. This is a mailroom bug: please report it with the output of `mailroom status`',
    ),
  );
  return true;
}
