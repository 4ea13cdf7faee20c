/**
 * The request context that follows work through mailroom (AsyncLocalStorage):
 * the correlation id of the request that caused it, and the job or event being
 * handled. `enqueue` and `publish` take their defaults from it, so a job
 * enqueued or an event published inside a handler carries the correlation id
 * on, with the handled job or event as its causation id.
 */
import { AsyncLocalStorage } from 'node:async_hooks';

/** What mailroom knows about the work in progress. */
export interface MailroomContext {
  /** The id of the originating request; travels onto every job and event it causes. */
  correlationId: string | null;
  /** The job being handled (in a worker or consumer handler). */
  jobId?: string;
  /** Its type and queue. */
  jobType?: string;
  queue?: string;
  attempt?: number;
  /** The id of the event being handled, when a consumer runs it. */
  eventId?: string;
}

const storage = new AsyncLocalStorage<MailroomContext>();

/** The context of the work in progress, or undefined outside of mailroom's handlers and {@link withCorrelation}. */
export function currentContext(): MailroomContext | undefined {
  return storage.getStore();
}

/** Runs `fn` in `context` (used by the worker around each handler). */
export function runInContext<T>(context: MailroomContext, fn: () => T): T {
  return storage.run(context, fn);
}

/**
 * Runs `fn` with `correlationId` as the current correlation id: every job
 * enqueued and event published inside (and inside the handlers they lead to)
 * carries it, unless given one explicitly. Use it at the edge of a request.
 *
 * @example
 * app.use((req, res, next) => withCorrelation(req.get('x-request-id') ?? randomUUID(), next));
 */
export function withCorrelation<T>(correlationId: string, fn: () => T): T {
  if (typeof correlationId !== 'string' || correlationId === '') {
    throw new TypeError(`withCorrelation: correlationId must be a non-empty string, got ${JSON.stringify(correlationId)}`);
  }
  return storage.run({ ...storage.getStore(), correlationId }, fn);
}

/**
 * Fields for every log line written during the work in progress: the
 * correlation id and the job (and event) being handled. Made for pino's
 * `mixin`, and handy in any logger.
 *
 * @example
 * const log = pino({ mixin: logContext });
 */
export function logContext(): Record<string, string | number> {
  const c = storage.getStore();
  if (!c) return {};
  const fields: Record<string, string | number> = {};
  if (c.correlationId) fields.correlationId = c.correlationId;
  if (c.jobId) fields.jobId = c.jobId;
  if (c.jobType) fields.jobType = c.jobType;
  if (c.queue) fields.queue = c.queue;
  if (c.attempt !== undefined) fields.attempt = c.attempt;
  if (c.eventId) fields.eventId = c.eventId;
  return fields;
}
