/**
 * The lifecycle events of a mailroom instance (`mailroom.on(...)`): every
 * worker, relay and consumer made by the instance reports here, and the
 * metrics and logs are built on these events rather than on separate paths.
 */
import type { SafetyWarning } from '../brokers/safety.ts';
import type { HeldBackBy } from '../relay/held-back.ts';
import type { ParkedEvent } from '../relay/parking.ts';

/** The job an event is about. */
export interface JobEventRef {
  id: string;
  type: string;
  queue: string;
  /** The attempt (1 for the first run). */
  attempt: number;
  correlationId: string | null;
}

/** Where an `error` or `warning` came from. */
export interface EventOrigin {
  /** `worker`, `relay`, `consumer`, `maintenance` or `http` (the Idempotency-Key middleware). */
  component: 'worker' | 'relay' | 'consumer' | 'maintenance' | 'http';
  /** The worker id, relay target or consumer group, when there is one. */
  name?: string;
}

/**
 * Events of `mailroom.on(name, listener)`. A listener that throws is logged and
 * never breaks processing.
 *
 * @example
 * mailroom.on('job.failed', (job) => log.warn({ id: job.id, willRetry: job.willRetry }, job.message));
 */
export interface MailroomEvents {
  /**
   * Jobs were inserted (one event per `enqueue`/`enqueueMany` call). With `tx`
   * it fires when the insert ran: the jobs exist only if that transaction commits.
   */
  'job.enqueued': [info: { type: string; queue: string; ids: string[]; inTransaction: boolean }];
  /** A worker started a job's handler. */
  'job.started': [job: JobEventRef & { worker: string }];
  /** A job's outcome `completed` was committed. `durationMs`: the handler's run time. */
  'job.completed': [job: JobEventRef & { durationMs: number }];
  /** An attempt failed and was recorded; `willRetry` false means it was dead-lettered (see `job.dead-lettered`). */
  'job.failed': [job: JobEventRef & { category: string; message: string; willRetry: boolean; runAt: Date | null; durationMs: number }];
  /** A job went to the dead-letter queue (by its handler's failure or by lease expiry). */
  'job.dead-lettered': [job: JobEventRef & { category: string; message: string }];
  /** A job whose lease expired was taken back (to `retrying`, or `dead` when out of attempts). */
  'job.rescued': [job: Omit<JobEventRef, 'correlationId'> & { dead: boolean }];
  /** A handler returned `snooze(...)`: the job runs again later without spending an attempt. */
  'job.snoozed': [job: JobEventRef & { delayMs: number }];
  /** A handler returned `cancel(reason)`: the job ended as cancelled. */
  'job.cancelled': [job: JobEventRef & { reason: string }];
  /** A handler threw `RateLimitedError`: its queue pauses for `delayMs`. */
  'job.rate-limited': [job: JobEventRef & { delayMs: number }];
  /** A result was refused because the job's lease was lost (it was rescued and maybe ran elsewhere). */
  'job.stale': [job: Omit<JobEventRef, 'correlationId'>];
  /** A relay delivered a batch to a target and moved its cursor. */
  'relay.published': [info: { target: string; count: number }];
  /** Committed events wait behind an open transaction. */
  'relay.held-back': [info: { target: string; waiting: number; heldBackBy: HeldBackBy }];
  /** A target refused an event for good; it was parked (`relay_parked`) and the events after it go on. */
  'relay.parked': [info: ParkedEvent];
  /** A redelivered event was acknowledged without running the handler (its inbox key existed). */
  'consumer.duplicate': [event: { group: string; id: string; type: string }];
  /** A broker or target setting breaks a guarantee. */
  warning: [warning: SafetyWarning & { origin: EventOrigin }];
  /** Infrastructure trouble (database unreachable, a target failing); processing goes on. */
  error: [info: { origin: EventOrigin; error: unknown }];
}

/** Names of {@link MailroomEvents}. */
export type MailroomEventName = keyof MailroomEvents;
