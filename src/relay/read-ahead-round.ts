/**
 * One batch for a read-ahead target (a broker): the batch read during the
 * previous round's confirm (or read now), published; the next one read
 * meanwhile (and, for a pipelined target, sent at once, conditional on this
 * one's last event); then the cursor's fenced advance. A failed publish or a
 * lost lease drops the batch read ahead: the next round reads again from the
 * cursor. See read-ahead.ts for the reads and known-cursor.ts for when a
 * round reads past the cursor it knows.
 */
import { unlessAborted } from '../time-limit.ts';
import { knownCursorStillHeld } from './known-cursor.ts';
import { NO_TRANSACTION, readBatch, type ReadBatch } from './read-ahead.ts';
import type { OutboxPoint } from './read-batch.ts';
import { RefusedEventError } from './refused.ts';
import { refusedRound } from './refused-round.ts';
import type { Ahead, Round, RoundHost, TargetState } from './round-state.ts';
import type { RelayedEvent } from './target.ts';
import { publishTraced } from './traced-publish.ts';

/** Delivers one batch to `s`'s read-ahead target; `lost` when another relay holds the lease. */
export async function readAheadRound(host: RoundHost, s: TargetState): Promise<Round> {
  const token = s.token;
  if (token === null) return { kind: 'lost' };
  const { options } = host;
  const name = s.target.name;
  const origin = await host.origin();
  const read = (from: OutboxPoint | null) =>
    readBatch({ driver: host.db, queries: host.queries, target: name, holder: host.id, token, leaseMs: options.leaseMs, batchSize: s.readSize.current, from });
  const ahead = s.ahead === null ? null : await s.ahead.catch((error: unknown) => (host.report(error), null));
  s.ahead = null;
  const known = s.known;
  s.known = null;
  let batch = ahead?.batch ?? null;
  let sent = ahead?.sent ?? null;
  let readAt = 0;
  let fromDatabase = false;
  if (batch === null || batch.token !== token) {
    await sent;
    sent = null;
    readAt = Date.now(); // after the wait for a send read ahead: the lease's age at the read itself
    const from = knownCursorStillHeld(known, token, readAt, options.leaseMs);
    fromDatabase = from === null;
    batch = await read(from);
  }
  if (batch === null) return { kind: 'lost' };
  const { plan } = batch;
  s.readSize.after(plan);
  const events = s.parked.without(batch.events);
  const { fence } = plan;
  if (plan.cursor === null || batch.events.length === 0) {
    // The cursor did not move: as read from the database just now (the lease renewed by that read), or as known before.
    s.known = fromDatabase ? { cursor: batch.from, token, renewedAt: readAt } : known;
    return { kind: 'done', delivered: 0, exhausted: plan.exhausted, blockedBy: plan.blockedBy, fence, cursor: batch.from };
  }
  const next = plan.cursor;
  // The batch before this one is confirmed: send this one as it is unless its conditional send was confirmed.
  const publishAgain = () => (events.length === 0 ? Promise.resolve() : publishTraced(s.target, events, { tx: NO_TRANSACTION, origin, signal: host.halt }));
  const publishing = sent === null ? publishAgain() : sent.then((confirmed) => (confirmed ? undefined : publishAgain()));
  if (!plan.exhausted && plan.blockedBy === null) s.ahead = readNext(host, s, read(next), events.at(-1) ?? null, origin);
  try {
    await unlessAborted(publishing, host.halt);
  } catch (error) {
    await dropReadAhead(host, s);
    if (error instanceof RefusedEventError) return refusedRound(host, s, token, error, events, fence, batch.from);
    throw error;
  }
  const advancedAt = Date.now();
  const advanced = await host.db.run(host.queries.advanceNow, [name, host.id, token, String(next.xid), String(next.position), events.length, options.leaseMs]);
  if (advanced.rowCount !== 1) {
    await dropReadAhead(host, s);
    return { kind: 'lost' };
  }
  s.known = { cursor: next, token, renewedAt: advancedAt };
  s.parked.passed(next);
  if (events.length > 0) host.tell('delivered', { target: name, count: events.length, cursor: { xid: String(next.xid), position: String(next.position) } });
  return { kind: 'done', delivered: events.length, exhausted: plan.exhausted, blockedBy: plan.blockedBy, fence, cursor: next };
}

/**
 * The next batch, read; a pipelined target sends it as soon as it is read,
 * conditional on `after` (this batch's last event), so that the broker
 * confirms both batches in one wait. A send refused (the condition failed,
 * or anything else) is sent again by its own round, once this batch is confirmed.
 */
function readNext(host: RoundHost, s: TargetState, reading: Promise<ReadBatch | null>, after: RelayedEvent | null, origin: string | undefined): Promise<Ahead | null> {
  return reading.then((batch) => {
    if (batch === null) return null;
    const events = s.parked.without(batch.events);
    if (s.target.pipelined !== true || after === null || events.length === 0 || batch.plan.cursor === null) return { batch, sent: null };
    const sent = publishTraced(s.target, events, { tx: NO_TRANSACTION, after, origin, signal: host.halt }).then(
      () => true,
      () => false,
    );
    return { batch, sent };
  });
}

/** Forgets the batch read ahead, once its read and any conditional send of it have settled. */
export async function dropReadAhead(host: Pick<RoundHost, 'halt'>, s: TargetState): Promise<void> {
  const ahead = s.ahead;
  s.ahead = null;
  const dropped = await ahead?.catch(() => null);
  if (dropped?.sent) await unlessAborted(dropped.sent, host.halt).catch(() => {});
}
