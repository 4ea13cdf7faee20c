import { isUuid } from '../ids.ts';
import type { Driver } from '../storage/driver.ts';
import type { JobQueries } from './queries.ts';

/** The states of a job. */
export type JobState = 'scheduled' | 'available' | 'active' | 'retrying' | 'completed' | 'dead' | 'cancelled';

/** One failed attempt, as kept in the job's history. */
export interface JobAttemptError {
  attempt: number;
  /** The worker that ran the attempt (null when unknown). */
  worker: string | null;
  startedAt: Date | null;
  category: string;
  message: string;
  stack: string | null;
  at: Date;
}

/** One line of a job's history, oldest first. */
export interface JobHistoryEntry {
  at: Date;
  event: 'enqueued' | 'started' | 'failed' | 'completed' | 'dead-lettered' | 'cancelled' | 'replayed' | 'discarded';
  attempt?: number;
  worker?: string;
  /** Who replayed or discarded it (`replayed`, `discarded`). */
  by?: string;
  detail?: string;
}

/** Everything mailroom knows about one job. */
export interface JobInfo {
  id: string;
  type: string;
  queue: string;
  state: JobState;
  /** For people: "queued", "processing", "completed", "will retry at …", "sent to support", "cancelled". */
  status: string;
  data: unknown;
  attempts: number;
  maxAttempts: number;
  priority: number;
  key: string | null;
  /** Jobs with this key run one at a time, in enqueue order. */
  orderingKey: string | null;
  correlationId: string | null;
  createdAt: Date;
  /** When it runs next (waiting states only). */
  nextRunAt: Date | null;
  startedAt: Date | null;
  finishedAt: Date | null;
  lockedBy: string | null;
  lockedUntil: Date | null;
  lastError: { category: string; message: string } | null;
  /** Why it was dead-lettered: the error category, `max-attempts` or `max-age`. */
  deadReason: string | null;
  errors: JobAttemptError[];
  history: JobHistoryEntry[];
}

interface JobRow {
  id: string;
  queue: string;
  type: string;
  state: JobState;
  priority: number;
  run_at: Date;
  attempt: number;
  max_attempts: number;
  locked_until: Date | null;
  locked_by: string | null;
  dedup_key: string | null;
  ordering_key: string | null;
  blocked: boolean;
  correlation_id: string | null;
  created_at: Date;
  started_at: Date | null;
  finished_at: Date | null;
  dead_reason: string | null;
  last_error: { category: string; message: string } | null;
  payload: unknown;
}

interface ErrorRow {
  attempt: number;
  worker: string | null;
  started_at: Date | null;
  category: string;
  message: string;
  stack: string | null;
  failed_at: Date;
}

/** The status line a support person reads. */
export function humanStatus(state: JobState, runAt: Date, waitingForKey: string | null = null): string {
  if (waitingForKey !== null && (state === 'scheduled' || state === 'available' || state === 'retrying')) {
    return `queued (waiting for an earlier job with ordering key ${waitingForKey} to finish)`;
  }
  switch (state) {
    case 'scheduled':
      return runAt.getTime() > Date.now() ? `scheduled for ${runAt.toISOString()}` : 'queued';
    case 'available':
      return 'queued';
    case 'active':
      return 'processing';
    case 'retrying':
      return `will retry at ${runAt.toISOString()}`;
    case 'completed':
      return 'completed';
    case 'dead':
      return 'sent to support';
    case 'cancelled':
      return 'cancelled';
  }
}

/** Reads one job and its attempt history; undefined when there is no such job (or the id is not a UUID). */
export async function getJob(driver: Driver, queries: JobQueries, id: string): Promise<JobInfo | undefined> {
  if (!isUuid(id)) return undefined;
  const { rows } = await driver.run<JobRow>(queries.getJob, [id]);
  const row = rows[0];
  if (!row) return undefined;
  const { rows: errorRows } = await driver.run<ErrorRow>(queries.getErrors, [id]);
  const errors: JobAttemptError[] = errorRows.map((e) => ({
    attempt: e.attempt,
    worker: e.worker,
    startedAt: e.started_at,
    category: e.category,
    message: e.message,
    stack: e.stack,
    at: e.failed_at,
  }));
  const history: JobHistoryEntry[] = [{ at: row.created_at, event: 'enqueued' }];
  const started = (at: Date, attempt: number, worker: string | null): JobHistoryEntry =>
    worker ? { at, event: 'started', attempt, worker } : { at, event: 'started', attempt };
  for (const e of errors) {
    if (e.startedAt) history.push(started(e.startedAt, e.attempt, e.worker));
    history.push({ at: e.at, event: 'failed', attempt: e.attempt, detail: `${e.category}: ${e.message}` });
  }
  const lastFailed = errors.at(-1);
  const lastRunStillOpen = row.started_at && (!lastFailed?.startedAt || row.started_at.getTime() > lastFailed.startedAt.getTime());
  if (row.started_at && lastRunStillOpen) history.push(started(row.started_at, row.attempt, row.locked_by));
  if (row.finished_at) {
    const event = row.state === 'completed' ? 'completed' : row.state === 'dead' ? 'dead-lettered' : 'cancelled';
    const entry: JobHistoryEntry = { at: row.finished_at, event, attempt: row.attempt };
    if (row.dead_reason) entry.detail = row.dead_reason;
    else if (row.state === 'cancelled' && row.last_error?.category === 'cancelled') entry.detail = row.last_error.message; // cancel(reason)
    history.push(entry);
  }
  // Stable sort: events with equal times keep their logical order.
  history.sort((a, b) => a.at.getTime() - b.at.getTime());
  const waiting = row.state === 'scheduled' || row.state === 'available' || row.state === 'retrying';
  return {
    id: row.id,
    type: row.type,
    queue: row.queue,
    state: row.state,
    status: humanStatus(row.state, row.run_at, row.blocked ? row.ordering_key : null),
    data: row.payload,
    attempts: row.attempt,
    maxAttempts: row.max_attempts,
    priority: row.priority,
    key: row.dedup_key,
    orderingKey: row.ordering_key,
    correlationId: row.correlation_id,
    createdAt: row.created_at,
    nextRunAt: waiting ? row.run_at : null,
    startedAt: row.started_at,
    finishedAt: row.finished_at,
    lockedBy: row.locked_by,
    lockedUntil: row.locked_until,
    lastError: row.last_error,
    deadReason: row.dead_reason,
    errors,
    history,
  };
}
