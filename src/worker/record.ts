import type { JobQueries } from '../jobs/queries.ts';
import type { Driver } from '../storage/driver.ts';
import type { Completer } from './completer.ts';
import { decideFailure, type Outcome } from './execute.ts';
import { cancelInTransaction, completeInTransaction, rescheduleInTransaction, type HandlerTransaction } from './handler-tx.ts';
import { RetryableError } from '../errors.ts';
import { isConcurrencyConflict } from '../storage/conflicts.ts';
import type { InboxKey } from './job-run.ts';
import type { ClaimedRow } from './types.ts';

/** What a recorded outcome turned out to be, for the worker's events. */
export type Recorded =
  | { kind: 'completed' }
  | { kind: 'snoozed'; delayMs: number }
  | { kind: 'cancelled'; reason: string }
  | { kind: 'rate-limited'; delayMs: number }
  | { kind: 'failed'; category: string; message: string; dead: boolean; runAt: Date | null }
  | { kind: 'stale' }
  | { kind: 'unknown' };

/** What recording needs from the worker. */
export interface RecordDeps {
  driver: Driver;
  queries: JobQueries;
  completer: Completer;
  /** Retries a write while the database is briefly unreachable. */
  withRetries<T>(write: () => Promise<T>): Promise<T>;
  report(error: unknown): void;
}

/**
 * Writes a handler's outcome as one fenced state change: completion (batched,
 * or inside the handler's `ctx.tx`), snooze / back-off, or failure (retry or
 * dead letter, with the attempt's error). A refused fence means another claim
 * owns the job now: the result is `stale` and nothing was written. A batched
 * completion also records `inboxKey` (a consumer's, when `ctx.tx` stayed closed).
 */
export async function recordOutcome(
  deps: RecordDeps,
  row: ClaimedRow,
  outcome: Exclude<Outcome, { kind: 'abandoned' }>,
  tx: HandlerTransaction | undefined,
  inboxKey?: InboxKey,
): Promise<Recorded> {
  if (tx?.isOpen && (outcome.kind === 'completed' || outcome.kind === 'snoozed' || outcome.kind === 'cancelled')) {
    // The handler's own writes and the fenced state change commit together, or not at all.
    let dead = false;
    const finish =
      outcome.kind === 'completed'
        ? completeInTransaction(deps.queries, row.id, row.claim_count)
        : outcome.kind === 'cancelled'
          ? cancelInTransaction(deps.queries, row.id, row.claim_count, outcome.reason)
          : rescheduleInTransaction(deps.queries, row.id, row.claim_count, outcome.delayMs, pastMaxAge(outcome), () => (dead = true));
    try {
      if (!(await tx.commitWith(finish))) return { kind: 'stale' };
    } catch (error) {
      // A deadlock or serialization failure rolled the transaction back and left the job ours:
      // record it now as a failed attempt (decided like any failure, retryable with no delay)
      // rather than wait for the lease to expire.
      if (isConcurrencyConflict(error)) {
        const message = `the transaction collided with another and was rolled back (${error instanceof Error ? error.message : String(error)}); it runs again`;
        return recordFailure(deps, row, decideFailure(row, new RetryableError(message, { after: 0 })));
      }
      deps.report(error); // The commit failed: nothing happened; the lease expires and the job runs again.
      return { kind: 'unknown' };
    }
    if (outcome.kind === 'completed' || outcome.kind === 'cancelled') return outcome;
    return dead ? deadPastMaxAge(outcome) : { kind: 'snoozed', delayMs: outcome.delayMs };
  }
  await tx?.rollback();
  if (outcome.kind === 'completed') {
    const recorded = await deps.completer.complete(row.id, row.claim_count, inboxKey); // the completer retries its batches
    return recorded ? { kind: 'completed' } : { kind: 'stale' };
  }
  if (outcome.kind === 'cancelled') {
    const { rowCount } = await deps.withRetries(() => deps.driver.run(deps.queries.cancelRun, [row.id, row.claim_count, outcome.reason]));
    return rowCount === 1 ? outcome : { kind: 'stale' };
  }
  if (outcome.kind === 'snoozed' || outcome.kind === 'rate-limited') {
    const category = outcome.kind === 'rate-limited' ? 'transient' : null;
    const { rows } = await deps.withRetries(() =>
      deps.driver.run<{ state: string }>(deps.queries.reschedule, [row.id, row.claim_count, outcome.delayMs, category, pastMaxAge(outcome)]),
    );
    if (rows.length === 0) return { kind: 'stale' };
    if (rows[0]!.state === 'dead') return deadPastMaxAge(outcome);
    return { kind: outcome.kind, delayMs: outcome.delayMs };
  }
  return recordFailure(deps, row, outcome);
}

/** The recorded message of a job dead-lettered because a snooze or a rate limit would take it past its maxAge. */
function pastMaxAge(outcome: Extract<Outcome, { kind: 'snoozed' | 'rate-limited' }>): string {
  return outcome.kind === 'snoozed'
    ? `snoozed for ${outcome.delayMs} ms, which would take the job past its maxAge`
    : `${outcome.message}; the queue's back-off of ${outcome.delayMs} ms would take the job past its maxAge`;
}

function deadPastMaxAge(outcome: Extract<Outcome, { kind: 'snoozed' | 'rate-limited' }>): Recorded {
  return { kind: 'failed', category: outcome.kind === 'rate-limited' ? 'transient' : 'max-age', message: pastMaxAge(outcome), dead: true, runAt: null };
}

/** Writes a failed attempt (retry or dead letter), fenced by the claim. */
async function recordFailure(deps: RecordDeps, row: ClaimedRow, outcome: Extract<Outcome, { kind: 'failed' }>): Promise<Recorded> {
  const { rows } = await deps.withRetries(() =>
    deps.driver.run<{ state: string; run_at: Date }>(deps.queries.fail, [
      row.id,
      row.claim_count,
      outcome.retry,
      outcome.delayMs,
      outcome.deadReason,
      outcome.category,
      outcome.message,
      outcome.stack,
    ]),
  );
  const first = rows[0];
  if (!first) return { kind: 'stale' };
  const dead = first.state === 'dead';
  return { kind: 'failed', category: outcome.category, message: outcome.message, dead, runAt: dead ? null : first.run_at };
}
