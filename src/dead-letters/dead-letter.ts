/** What a dead letter looks like to people and scripts, and how a row becomes one. */
import { redact } from '../observe/redact.ts';
import type { JobAttemptError, JobHistoryEntry } from '../jobs/get.ts';

/** A dead job, as the dead-letter queue shows it. `data` has the `redact` fields hidden. */
export interface DeadLetter {
  id: string;
  queue: string;
  /** The team that owns the queue (`createMailroom({ queues })`), or null. */
  owner: string | null;
  /** The job type (the event type for a consumer group's job). */
  type: string;
  /** The last error's category (`permanent`, `validation`, `unknown-type`, `transient`, …), else the dead reason. */
  category: string;
  /** Why it died: the error category for a failure that was not retried, `max-attempts` or `max-age`. */
  reason: string | null;
  /** The last error's message. */
  message: string | null;
  attempts: number;
  maxAttempts: number;
  correlationId: string | null;
  /** When the job was first enqueued. */
  firstSeenAt: Date;
  /** When it died. */
  diedAt: Date;
  /** The payload, with the configured fields replaced by `[redacted]`. */
  data: unknown;
}

/** One dead letter with everything known about it (`deadLetters.show`). */
export interface DeadLetterDetail extends DeadLetter {
  /** The dedup key the job was enqueued with. */
  key: string | null;
  orderingKey: string | null;
  priority: number;
  /** Every failed attempt, oldest first. */
  errors: JobAttemptError[];
  /** Enqueued, started, failed, dead-lettered, replayed…, oldest first. */
  history: JobHistoryEntry[];
}

/** A dead job's row, as the list statement returns it. */
export interface DeadLetterRow {
  id: string;
  queue: string;
  type: string;
  dead_reason: string | null;
  last_error: { category?: string; message?: string } | null;
  attempt: number;
  max_attempts: number;
  correlation_id: string | null;
  created_at: Date;
  finished_at: Date;
  payload: unknown;
  /** `finished_at` to the microsecond (a Date keeps milliseconds), for the page cursor. */
  died_at_exact: string;
}

/** What turning rows into dead letters needs from the mailroom. */
export interface Presentation {
  redactPaths: readonly string[];
  ownerOf(queue: string): string | null;
}

/** Makes the public shape of a row. */
export function toDeadLetter(row: DeadLetterRow, view: Presentation): DeadLetter {
  return {
    id: row.id,
    queue: row.queue,
    owner: view.ownerOf(row.queue),
    type: row.type,
    category: row.last_error?.category ?? row.dead_reason ?? 'unknown',
    reason: row.dead_reason,
    message: row.last_error?.message ?? null,
    attempts: row.attempt,
    maxAttempts: row.max_attempts,
    correlationId: row.correlation_id,
    firstSeenAt: row.created_at,
    diedAt: row.finished_at,
    data: redact(row.payload, view.redactPaths),
  };
}
