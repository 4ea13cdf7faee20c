/**
 * Error types a handler can throw to tell mailroom what to do next, and the
 * errors mailroom itself throws for bad input or bad configuration.
 */

/** Base class of every error mailroom throws on its own account. */
export class MailroomError extends Error {
  override name = 'MailroomError';
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
 * Throw from a handler for a failure worth retrying. `after` (a duration such
 * as `'30s'` or milliseconds) overrides the backoff, e.g. to honour a
 * Retry-After header.
 *
 * @example
 * if (res.status === 503) throw new RetryableError('provider unavailable', { after: res.headers.get('retry-after') + 's' });
 */
export class RetryableError extends Error {
  override name = 'RetryableError';
  readonly after: string | number | undefined;
  constructor(message: string, options?: { after?: string | number; cause?: unknown }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.after = options?.after;
  }
}

/**
 * Throw from a handler when a provider says "too many requests" (HTTP 429):
 * the whole queue backs off for `after` (default 1s) in every process, and
 * this job runs again after it without spending an attempt.
 *
 * @example
 * if (res.status === 429) throw new RateLimitedError('provider rate limit', { after: `${res.headers.get('retry-after') ?? 1}s` });
 */
export class RateLimitedError extends Error {
  override name = 'RateLimitedError';
  readonly after: string | number | undefined;
  constructor(message: string, options?: { after?: string | number; cause?: unknown }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.after = options?.after;
  }
}
