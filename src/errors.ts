import { parseRetryAfter, type RetryAfter } from './retry/retry-after.ts';

/**
 * Error types a handler can throw to tell mailroom what to do next, and the
 * errors mailroom itself throws for bad input or bad configuration.
 */

/** Base class of every error mailroom throws on its own account. */
export class MailroomError extends Error {
  override name = 'MailroomError';
}

/**
 * Thrown when a `tx` given to enqueue or publish is not (or no longer) inside a
 * transaction (its transaction already committed or rolled back): nothing was written.
 *
 * @example
 * try { await mailroom.enqueue(job, data, { tx: client }); }
 * catch (err) { if (err instanceof TransactionEndedError) console.error('enqueue before COMMIT'); }
 */
export class TransactionEndedError extends MailroomError {
  override name = 'TransactionEndedError';
}

/**
 * Bad input at an API boundary: a payload that fails validation, an invalid
 * name, a negative delay. Nothing was written.
 *
 * @example
 * try { await mailroom.enqueue(sendWelcome, { email: 42 }); }
 * catch (err) { if (err instanceof ValidationError) console.log(err.issues); }
 */
export class ValidationError extends MailroomError {
  override name = 'ValidationError';
  /** One entry per problem, each naming the field (`path`) it concerns. */
  readonly issues: ReadonlyArray<{ path: string; message: string }>;
  constructor(message: string, issues: ReadonlyArray<{ path: string; message: string }> = []) {
    super(message);
    this.issues = issues;
  }
}

/**
 * Throw from a handler when retrying cannot help (bad request, missing
 * record): the job is dead-lettered at once with category `permanent`.
 *
 * @example
 * if (!user) throw new PermanentError(`user ${job.data.userId} does not exist`);
 */
export class PermanentError extends Error {
  override name = 'PermanentError';
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

/**
 * Throw from a handler for a failure worth retrying. `after` overrides the
 * backoff: a duration (`'30s'`, or milliseconds), or a Retry-After header's
 * value as the server sent it (`'120'` seconds, or an HTTP date; `null` when
 * the header is absent keeps the backoff). A value that is none of these
 * keeps the backoff too, and the job's recorded error says why.
 *
 * @example
 * if (res.status === 503) throw new RetryableError('provider unavailable', { after: res.headers.get('retry-after') });
 */
export class RetryableError extends Error {
  override name = 'RetryableError';
  /** The `after` given, as given. */
  readonly after: RetryAfter;
  /** `after` in milliseconds from when the error was made; undefined when none was given or it could not be read. */
  readonly afterMs: number | undefined;
  /** Why `after` could not be read, when it could not. */
  readonly afterProblem: string | undefined;
  constructor(message: string, options?: { after?: RetryAfter; cause?: unknown }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.after = options?.after;
    const parsed = parseRetryAfter(options?.after, 'RetryableError.after');
    this.afterMs = parsed.ms;
    this.afterProblem = parsed.problem;
  }
}

/**
 * Throw from a handler when a provider says "too many requests" (HTTP 429):
 * the whole queue backs off for `after` in every process, and this job runs
 * again after it without spending an attempt. `after` takes what
 * `RetryableError` takes; when it is absent or cannot be read the queue
 * backs off for 1 s (and the job's recorded message says why).
 *
 * @example
 * if (res.status === 429) throw new RateLimitedError('provider rate limit', { after: res.headers.get('retry-after') });
 */
export class RateLimitedError extends Error {
  override name = 'RateLimitedError';
  /** The `after` given, as given. */
  readonly after: RetryAfter;
  /** How long the queue backs off, in milliseconds: `after`, or 1 s when it is absent or could not be read. */
  readonly afterMs: number;
  /** Why `after` could not be read, when it could not. */
  readonly afterProblem: string | undefined;
  constructor(message: string, options?: { after?: RetryAfter; cause?: unknown }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.after = options?.after;
    const parsed = parseRetryAfter(options?.after, 'RateLimitedError.after');
    this.afterMs = parsed.ms ?? 1000;
    this.afterProblem = parsed.problem;
  }
}
