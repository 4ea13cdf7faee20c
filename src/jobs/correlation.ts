import { ValidationError } from '../errors.ts';
import type { Driver } from '../storage/driver.ts';
import type { CorrelationQueries } from './correlation-queries.ts';
import { humanStatus, type JobState } from './get.ts';

/** One job in a correlation trail: what it is, where it waits and how it is doing. */
export interface JobSummary {
  kind: 'job';
  id: string;
  type: string;
  queue: string;
  state: JobState;
  /** For people, as in `jobs.get`: "queued", "processing", "completed", "will retry at …", "sent to support". */
  status: string;
  attempts: number;
  maxAttempts: number;
  orderingKey: string | null;
  createdAt: Date;
  finishedAt: Date | null;
  lastError: { category: string; message: string } | null;
  /** Why it was dead-lettered: the error category, `max-attempts` or `max-age`. */
  deadReason: string | null;
  /** The consumer group whose queue it is in (a job made from an event), or null for a plain job. */
  consumerGroup: string | null;
  /** For a consumer group's job: the id of the event it was made from. */
  eventId: string | null;
}

/** One outbox event in a correlation trail, and how far the relay has taken it. */
export interface OutboxEventSummary {
  kind: 'event';
  id: string;
  type: string;
  /** The event's key (CloudEvents `subject`), or null. */
  key: string | null;
  /** The event's time (CloudEvents `time`). */
  time: Date;
  /** When its outbox row was written. */
  createdAt: Date;
  causationId: string | null;
  /** Relay targets whose cursor has passed it (`internal` is the fan-out to consumer groups). */
  publishedTo: string[];
  /** Relay targets that have not reached it yet. */
  pendingTo: string[];
}

/** Everything one request caused: its jobs and its events, each oldest first. */
export interface CorrelationTrail {
  jobs: JobSummary[];
  events: OutboxEventSummary[];
}

/** Options of `jobs.byCorrelation`. */
export interface ByCorrelationOptions {
  /** At most this many jobs and this many events (default 1000, at most 10000). */
  limit?: number;
}

/** The default and largest `limit` of `jobs.byCorrelation`. */
export const CORRELATION_LIMIT = { default: 1000, max: 10_000 } as const;
const MAX_CORRELATION_ID_LENGTH = 256;

interface JobRow {
  id: string;
  type: string;
  queue: string;
  state: JobState;
  run_at: Date;
  attempt: number;
  max_attempts: number;
  blocked: boolean;
  ordering_key: string | null;
  created_at: Date;
  finished_at: Date | null;
  dead_reason: string | null;
  last_error: { category: string; message: string } | null;
  consumer_group: string | null;
  event_id: string | null;
}

interface EventRow {
  id: string;
  type: string;
  subject: string | null;
  time: Date;
  created_at: Date;
  causation_id: string | null;
  published_to: string[];
  pending_to: string[];
}

function checkArguments(correlationId: unknown, options: unknown): number {
  if (typeof correlationId !== 'string' || correlationId === '' || correlationId.length > MAX_CORRELATION_ID_LENGTH) {
    throw new ValidationError(
      `jobs.byCorrelation: correlationId must be a non-empty string of at most ${MAX_CORRELATION_ID_LENGTH} characters (the correlationId given to enqueue or publish), got ${
        typeof correlationId === 'string' ? `a string of ${correlationId.length} characters` : typeof correlationId
      }`,
      [{ path: 'correlationId', message: 'expected a non-empty string' }],
    );
  }
  if (options === undefined) return CORRELATION_LIMIT.default;
  if (typeof options !== 'object' || options === null) {
    throw new ValidationError('jobs.byCorrelation: options must be an object such as { limit: 100 }', [{ path: 'options', message: 'expected an object' }]);
  }
  const { limit } = options as { limit?: unknown };
  if (limit === undefined) return CORRELATION_LIMIT.default;
  if (typeof limit !== 'number' || !Number.isInteger(limit) || limit < 1 || limit > CORRELATION_LIMIT.max) {
    throw new ValidationError(`jobs.byCorrelation: limit must be a whole number from 1 to ${CORRELATION_LIMIT.max}, got ${String(limit)}`, [
      { path: 'limit', message: `expected 1..${CORRELATION_LIMIT.max}` },
    ]);
  }
  return limit;
}

/**
 * Reads every job (of any queue, consumer groups' included) and every outbox
 * event that carries `correlationId`, each list oldest first, at most `limit`
 * of each. Events say which relay targets have published them.
 *
 * @example
 * const { jobs, events } = await readCorrelation(driver, queries, 'req-42');
 */
export async function readCorrelation(driver: Driver, queries: CorrelationQueries, correlationId: string, options?: ByCorrelationOptions): Promise<CorrelationTrail> {
  const limit = checkArguments(correlationId, options);
  const [jobs, events] = await Promise.all([
    driver.run<JobRow>(queries.jobs, [correlationId, limit]),
    driver.run<EventRow>(queries.events, [correlationId, limit]),
  ]);
  return {
    jobs: jobs.rows.map((r) => ({
      kind: 'job',
      id: r.id,
      type: r.type,
      queue: r.queue,
      state: r.state,
      status: humanStatus(r.state, r.run_at, r.blocked ? r.ordering_key : null),
      attempts: r.attempt,
      maxAttempts: r.max_attempts,
      orderingKey: r.ordering_key,
      createdAt: r.created_at,
      finishedAt: r.finished_at,
      lastError: r.last_error,
      deadReason: r.dead_reason,
      consumerGroup: r.consumer_group,
      eventId: r.event_id,
    })),
    events: events.rows.map((r) => ({
      kind: 'event',
      id: r.id,
      type: r.type,
      key: r.subject,
      time: r.time,
      createdAt: r.created_at,
      causationId: r.causation_id,
      publishedTo: r.published_to,
      pendingTo: r.pending_to,
    })),
  };
}
