/**
 * One batch for a target that writes through the relay's transaction (the
 * internal fan-out): the fenced start (zero rows: the lease is lost), the
 * commit-safe read, the target's delivery and the cursor's advance, all in
 * one transaction.
 */
import { planBatch, readFence, type OutboxPoint } from './read-batch.ts';
import { RefusedEventError } from './refused.ts';
import { refusedRound } from './refused-round.ts';
import type { Round, RoundHost, TargetState } from './round-state.ts';
import { StoredEvent } from './stored-event.ts';
import { publishTraced } from './traced-publish.ts';

class LeaseLost extends Error {}

/** Delivers one batch to `s`'s target in one transaction; `lost` when another relay holds the lease. */
export async function transactionalRound(host: RoundHost, s: TargetState): Promise<Round> {
  const token = s.token;
  if (token === null) return { kind: 'lost' };
  const { db, queries } = host;
  const name = s.target.name;
  const origin = await host.origin();
  const fence = await readFence(db, queries);
  let start: OutboxPoint | null = null;
  let sent: StoredEvent[] = [];
  try {
    // A relay paused with the round open (SIGSTOP) must not hold the cursor past its lease: the
    // server ends a transaction left idle that long.
    const result = await db.transaction(async (tx): Promise<Round> => {
      const begun = await tx.run<{ cursor_xid: string; cursor_position: string }>(queries.beginRound, [name, host.id, token, host.options.leaseMs]);
      const row = begun.rows[0];
      if (!row) return { kind: 'lost' };
      const cursor = { xid: BigInt(row.cursor_xid), position: BigInt(row.cursor_position) };
      start = cursor;
      const plan = await planBatch(tx, queries, cursor, fence, s.readSize.current);
      s.readSize.after(plan);
      if (plan.rows.length === 0 || plan.cursor === null) {
        return { kind: 'done', delivered: 0, exhausted: plan.exhausted, blockedBy: plan.blockedBy, fence, cursor };
      }
      const events = s.parked.without(plan.rows.map((row) => new StoredEvent(row)));
      sent = events;
      if (events.length > 0) await publishTraced(s.target, events, { tx, origin, signal: host.halt });
      const next = plan.cursor;
      const advanced = await tx.run(queries.advance, [name, host.id, token, String(next.xid), String(next.position), events.length]);
      if (advanced.rowCount !== 1) throw new LeaseLost('lease lost during the round');
      return { kind: 'done', delivered: events.length, exhausted: plan.exhausted, blockedBy: plan.blockedBy, fence, cursor: next };
    }, { idleTimeoutMs: Math.max(1, Math.ceil(host.options.leaseMs)) });
    if (result.kind === 'done') s.parked.passed(result.cursor);
    if (result.kind === 'done' && result.delivered > 0) {
      const { xid, position } = result.cursor;
      host.tell('delivered', { target: name, count: result.delivered, cursor: { xid: String(xid), position: String(position) } });
    }
    return result;
  } catch (error) {
    if (error instanceof LeaseLost) return { kind: 'lost' };
    if (error instanceof RefusedEventError && start !== null) return refusedRound(host, s, token, error, sent, fence, start);
    throw error;
  }
}
