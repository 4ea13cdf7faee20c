/**
 * What a worker tells its listeners: the events, the job reference each
 * carries, and the event a recorded outcome calls for.
 */
import type { JobEventRef } from '../observe/lifecycle.ts';
import type { SafeEmitter } from '../observe/safe-emitter.ts';
import type { Recorded } from './record.ts';
import type { ClaimedRow } from './types.ts';

/**
 * Events a worker emits; handy for logs, metrics and tests. A listener that
 * throws is logged and never breaks processing. `mailroom.on('job.*')` gets
 * the same events from every worker.
 */
export interface WorkerEvents {
  /** A job's handler started. */
  started: [job: JobEventRef];
  /** The outcome `completed` was committed; `durationMs` is the handler's run time. */
  completed: [job: JobEventRef & { durationMs: number }];
  /** An attempt failed and was recorded; `dead` (= !willRetry): it went to the dead-letter queue. */
  failed: [job: JobEventRef, detail: { category: string; message: string; dead: boolean; willRetry: boolean; runAt: Date | null; durationMs: number }];
  snoozed: [job: JobEventRef, delayMs: number];
  /** The handler returned `cancel(reason)`: the job ended as cancelled. */
  cancelled: [job: JobEventRef, reason: string];
  /** A result was refused because the job's lease was lost (it was rescued and maybe claimed again). */
  stale: [job: JobEventRef];
  /** A handler threw RateLimitedError: the queue backs off; the job runs again without spending an attempt. */
  'rate-limited': [job: JobEventRef, delayMs: number];
  /** A job handed back on a graceful stop that ran out of time. */
  released: [job: { id: string; type: string }];
  /** Infrastructure trouble (database unreachable...). The worker keeps going. */
  error: [error: unknown];
}

/** The event payload of a claimed job. */
export function refOf(row: ClaimedRow): JobEventRef {
  return { id: row.id, type: row.type, queue: row.queue, attempt: row.attempt, correlationId: row.correlation_id };
}

/**
 * Emits the event that a recorded outcome calls for (`completed`, `failed`,
 * `snoozed`, …; nothing when the outcome is unknown).
 *
 * @example
 * emitRecorded(worker, row, await recordOutcome(deps, row, outcome, tx), durationMs);
 */
export function emitRecorded(emitter: SafeEmitter<WorkerEvents>, row: ClaimedRow, result: Recorded, durationMs: number): void {
  const job = refOf(row);
  switch (result.kind) {
    case 'completed':
      emitter.emit('completed', { ...job, durationMs });
      break;
    case 'snoozed':
      emitter.emit('snoozed', job, result.delayMs);
      break;
    case 'cancelled':
      emitter.emit('cancelled', job, result.reason);
      break;
    case 'rate-limited':
      emitter.emit('rate-limited', job, result.delayMs);
      break;
    case 'failed':
      emitter.emit('failed', job, {
        category: result.category,
        message: result.message,
        dead: result.dead,
        willRetry: !result.dead,
        runAt: result.runAt,
        durationMs,
      });
      break;
    case 'stale':
      emitter.emit('stale', job);
      break;
    case 'unknown':
      break;
  }
}
