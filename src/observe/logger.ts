/**
 * mailroom's own log lines, written to a logger the application gives
 * (`createMailroom({ logger })`), built on the lifecycle events. The shape
 * fits pino (`logger.warn(fields, message)`), and bunyan; a console-like
 * logger works too. Every line about a job carries its correlation id.
 */
import type { JobEventRef, MailroomEvents } from './lifecycle.ts';
import type { SafeEmitter } from './safe-emitter.ts';

type LogMethod = (fields: Record<string, unknown>, message: string) => void;

/** A logger mailroom can write to: pino's, or anything with these methods. */
export interface MailroomLogger {
  error: LogMethod;
  warn: LogMethod;
  info: LogMethod;
  /** Per-job lines (started, completed, published) go here; leave it out to skip them. */
  debug?: LogMethod;
  /** pino's level check: debug lines are not even built when it says no. */
  isLevelEnabled?(level: string): boolean;
}

function jobFields(job: Omit<JobEventRef, 'correlationId'> & { correlationId?: string | null }): Record<string, unknown> {
  const fields: Record<string, unknown> = { jobId: job.id, jobType: job.type, queue: job.queue, attempt: job.attempt };
  if (job.correlationId) fields.correlationId = job.correlationId;
  return fields;
}

function errorFields(error: unknown): Record<string, unknown> {
  return error instanceof Error ? { err: { type: error.name, message: error.message, stack: error.stack } } : { err: String(error) };
}

/**
 * Subscribes `logger` to `bus`: failures, dead letters, rescues, hold-backs,
 * duplicates, warnings and errors always; per-job lines at debug level when
 * the logger has it enabled.
 *
 * @example
 * const mailroom = await createMailroom({ logger: pino({ mixin: logContext }) });
 */
export function attachLogger(bus: SafeEmitter<MailroomEvents>, logger: MailroomLogger): void {
  bus.on('job.failed', (job) => {
    if (job.willRetry) logger.warn({ ...jobFields(job), category: job.category, error: job.message, retryAt: job.runAt?.toISOString() }, `job ${job.type} failed; will retry`);
  });
  bus.on('job.dead-lettered', (job) => logger.error({ ...jobFields(job), category: job.category, error: job.message }, `job ${job.type} sent to the dead-letter queue`));
  bus.on('job.rescued', (job) => logger.warn(jobFields(job), `job ${job.type} taken back after its lease expired${job.dead ? ' (out of attempts: dead-lettered)' : ''}`));
  bus.on('job.stale', (job) => logger.warn(jobFields(job), `job ${job.type}: result refused, its lease was lost`));
  bus.on('job.rate-limited', (job) => logger.info({ ...jobFields(job), delayMs: job.delayMs }, `queue ${job.queue} backs off: rate limited`));
  bus.on('relay.held-back', (info) =>
    logger.warn({ target: info.target, waiting: info.waiting, heldBackBy: info.heldBackBy }, `relay ${info.target}: committed events wait behind an open transaction`),
  );
  bus.on('relay.parked', (info) =>
    logger.error(
      { target: info.target, eventId: info.eventId, eventType: info.type, position: info.position, reason: info.reason },
      `relay ${info.target}: event ${info.eventId} (${info.type}) refused for good and parked: ${info.reason}`,
    ),
  );
  bus.on('consumer.duplicate', (event) => logger.info({ group: event.group, eventId: event.id, eventType: event.type }, `consumer ${event.group}: duplicate delivery acknowledged without running the handler`));
  bus.on('warning', (warning) => logger.warn({ code: warning.code, subject: warning.subject, origin: warning.origin }, warning.message));
  bus.on('error', ({ origin, error }) => logger.error({ origin, ...errorFields(error) }, `${origin.component}${origin.name ? ` ${origin.name}` : ''}: ${error instanceof Error ? error.message : String(error)}`));
  const debug = logger.debug;
  if (debug && (logger.isLevelEnabled?.('debug') ?? true)) {
    bus.on('job.started', (job) => debug.call(logger, { ...jobFields(job), worker: job.worker }, `job ${job.type} started`));
    bus.on('job.completed', (job) => debug.call(logger, { ...jobFields(job), durationMs: Math.round(job.durationMs * 1000) / 1000 }, `job ${job.type} completed`));
    bus.on('job.snoozed', (job) => debug.call(logger, { ...jobFields(job), delayMs: job.delayMs }, `job ${job.type} snoozed`));
    bus.on('job.cancelled', (job) => debug.call(logger, { ...jobFields(job), reason: job.reason }, `job ${job.type} cancelled by its handler`));
    bus.on('relay.published', (info) => debug.call(logger, { target: info.target, count: info.count }, `relay ${info.target}: published ${info.count}`));
  }
}

/** Checks that `logger` has the methods mailroom writes to (pino's shape). */
export function checkLogger(logger: unknown): asserts logger is MailroomLogger {
  const missing = ['error', 'warn', 'info'].filter((m) => typeof (logger as Record<string, unknown> | null)?.[m] !== 'function');
  if (missing.length > 0) {
    throw new TypeError(`logger must have ${missing.join(', ')} methods taking (fields, message), as pino's do; got ${logger === null ? 'null' : typeof logger}`);
  }
}
