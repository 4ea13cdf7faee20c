/**
 * Reading back what the code under test enqueued and published, typed by
 * the definitions it used.
 */
import type { JobDefinition } from '../define.ts';
import type { EventDefinition } from '../events/define-event.ts';
import type { JobState } from '../jobs/get.ts';
import type { Mailroom } from '../mailroom.ts';
import { ValidationError } from '../errors.ts';
import { runTestingQuery } from './queries.ts';

/** A job as `enqueuedJobs` returns it. */
export interface EnqueuedJob<TData> {
  id: string;
  queue: string;
  state: JobState;
  /** The payload as stored (after the definition's schema). */
  data: TData;
  priority: number;
  /** When it runs (next). */
  runAt: Date;
  /** Attempts made so far. */
  attempt: number;
  key: string | null;
  orderingKey: string | null;
  correlationId: string | null;
  createdAt: Date;
}

/** An outbox event as `publishedEvents` returns it. */
export interface PublishedEvent<TData> {
  id: string;
  /** The event's position in the outbox (publish order), as a decimal string. */
  position: string;
  version: number;
  data: TData;
  /** The event's key (CloudEvents `subject`). */
  key: string | null;
  correlationId: string | null;
  causationId: string | null;
  traceparent: string | null;
  time: Date;
}

const JOB_STATES: readonly JobState[] = ['scheduled', 'available', 'active', 'retrying', 'completed', 'dead', 'cancelled'];
/** The states of a job that waits to run: what "enqueued" means by default. */
const WAITING_STATES: readonly JobState[] = ['scheduled', 'available', 'retrying'];

interface JobRow {
  id: string;
  queue: string;
  state: JobState;
  data: unknown;
  priority: number;
  run_at: Date | string;
  attempt: number;
  dedup_key: string | null;
  ordering_key: string | null;
  correlation_id: string | null;
  created_at: Date | string;
}

interface EventRow {
  id: string;
  position: string;
  version: number;
  subject: string | null;
  data: unknown;
  correlation_id: string | null;
  causation_id: string | null;
  traceparent: string | null;
  time: Date | string;
}

const asDate = (value: Date | string): Date => (value instanceof Date ? value : new Date(value));

function statesOf(states: readonly JobState[] | 'all' | undefined): readonly JobState[] {
  if (states === undefined) return WAITING_STATES;
  if (states === 'all') return JOB_STATES;
  if (!Array.isArray(states) || states.length === 0 || states.some((s) => !JOB_STATES.includes(s))) {
    throw new ValidationError(`enqueuedJobs: states must be 'all' or a non-empty list of ${JOB_STATES.join(', ')}; got ${JSON.stringify(states)}`, [
      { path: 'states', message: 'invalid' },
    ]);
  }
  return states;
}

/**
 * The jobs of one definition, oldest first: by default those waiting to run
 * (`scheduled`, `available`, `retrying`); `states` picks others, or `'all'`.
 *
 * @example
 * await signUp(mailroom, 'ada@example.com');
 * const [job] = await enqueuedJobs(mailroom, sendWelcome);
 * assert.equal(job.data.email, 'ada@example.com');
 */
export async function enqueuedJobs<TData, TInput>(
  mailroom: Mailroom,
  def: JobDefinition<TData, TInput>,
  options: { states?: readonly JobState[] | 'all' } = {},
): Promise<EnqueuedJob<TData>[]> {
  const states = statesOf(options.states);
  const rows = await runTestingQuery<JobRow>(mailroom, 'jobsOfType', [def.name, states]);
  return rows.map((r) => ({
    id: r.id,
    queue: r.queue,
    state: r.state,
    data: r.data as TData,
    priority: r.priority,
    runAt: asDate(r.run_at),
    attempt: r.attempt,
    key: r.dedup_key,
    orderingKey: r.ordering_key,
    correlationId: r.correlation_id,
    createdAt: asDate(r.created_at),
  }));
}

/**
 * The events of one definition in the outbox, in publish order (committed
 * ones only; events the relay delivered stay until retention removes them).
 *
 * @example
 * await placeOrder(mailroom, { id: 'o-1' });
 * const [event] = await publishedEvents(mailroom, orderPlaced);
 * assert.equal(event.key, 'o-1');
 */
export async function publishedEvents<TData, TInput>(mailroom: Mailroom, def: EventDefinition<TData, TInput>): Promise<PublishedEvent<TData>[]> {
  const rows = await runTestingQuery<EventRow>(mailroom, 'eventsOfType', [def.type]);
  return rows.map((r) => ({
    id: r.id,
    position: r.position,
    version: r.version,
    data: r.data as TData,
    key: r.subject,
    correlationId: r.correlation_id,
    causationId: r.causation_id,
    traceparent: r.traceparent,
    time: asDate(r.time),
  }));
}
