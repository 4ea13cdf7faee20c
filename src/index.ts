/**
 * mailroom: reliable messaging for TypeScript on PostgreSQL.
 * At-least-once delivery; exactly-once effects.
 */
export { createMailroom, Mailroom } from './mailroom.ts';
export type { MailroomOptions, MailroomTransaction, JobsApi, VersionsApi } from './mailroom.ts';
export type { JobActionResult } from './jobs/admin.ts';
export type { MailroomStats, QueueStats } from './stats.ts';
export { defineJob, handle } from './define.ts';
export type { JobDefinition, JobOptions, JobData, JobInput } from './define.ts';
export { PermanentError, RetryableError, RateLimitedError, ValidationError, MailroomError } from './errors.ts';
export { snooze, isSnooze } from './snooze.ts';
export type { Snooze } from './snooze.ts';
export type { Duration } from './duration.ts';
export type { RetryOptions, BackoffOptions, RetryPolicy } from './retry/backoff.ts';
export { backoffDelay } from './retry/backoff.ts';
export { defaultClassifier } from './retry/classify.ts';
export type { ErrorCategory, ErrorClassifier, Classification } from './retry/classify.ts';
export type { EnqueueOptions, EnqueueManyOptions } from './jobs/enqueue.ts';
export type { JobInfo, JobState, JobHistoryEntry, JobAttemptError } from './jobs/get.ts';
export { Worker } from './worker/worker.ts';
export type { WorkerOptions, WorkerEvents } from './worker/worker.ts';
export type { Job, JobContext, JobHandler, TxHandle } from './worker/types.ts';
export type { TransactionLike } from './storage/driver.ts';
export { migrations, migrationSql } from './storage/migrations.ts';
export type { Migration } from './storage/migrations.ts';
export type { RetentionOptions } from './retention.ts';
export type { RateLimit } from './worker/queue-controls.ts';
export { defineEvent } from './events/define-event.ts';
export type { EventDefinition, EventOptions, EventData, EventInput } from './events/define-event.ts';
export type { PublishOptions, PublishManyOptions } from './events/publish-options.ts';
export { TransactionEndedError } from './events/publish.ts';
export { toEnvelope, fromEnvelope, dataschemaOf } from './events/envelope.ts';
export type { CloudEventEnvelope, ConsumedEvent } from './events/envelope.ts';
export type { RelayTargetStats, ConsumerGroupStats } from './events/event-stats.ts';
export { Relay } from './relay/relay.ts';
export type { RelayEvents, RelayFlushResult } from './relay/relay.ts';
export type { RelayOptions } from './relay/options.ts';
export type { RelayTarget, RelayedEvent, RelayContext } from './relay/target.ts';
export type { HeldBackBy } from './relay/held-back.ts';
export { Consumer } from './consumers/consumer.ts';
export type { ConsumerEvents } from './consumers/consumer.ts';
export type { ConsumerOptions } from './consumers/options.ts';
export { handleEvent } from './consumers/handle-event.ts';
export type { EventHandler, ConsumerContext } from './consumers/handle-event.ts';
