import { PermanentError, RetryableError, ValidationError } from '../errors.ts';

/**
 * Why an attempt failed. `permanent`, `validation` and `unknown-type` are never
 * retried; `transient`, `timeout` and `lease-expired` are.
 */
export type ErrorCategory = 'permanent' | 'validation' | 'unknown-type' | 'transient' | 'timeout' | 'lease-expired';

/** What a classifier decides about one failure. */
export interface Classification {
  category: ErrorCategory;
  /** Retry (subject to maxAttempts / maxAge) or dead-letter now. */
  retry: boolean;
  /** Overrides the backoff delay, in milliseconds (e.g. from Retry-After). */
  retryAfterMs?: number;
}

/** Decides whether an error is worth retrying. Replaceable per job definition. */
export type ErrorClassifier = (error: unknown) => Classification;

// 409 is retried: it often means "in progress, try again" (an Idempotency-Key in use; mailroom/http answers so).
const PERMANENT_STATUS = new Set([400, 401, 403, 404, 405, 410, 413, 415, 422]);
// zod throws ZodError (zod/mini: $ZodError); joi, yup, mongoose and others throw errors named ValidationError.
const VALIDATION_ERROR_NAMES = new Set<unknown>(['ValidationError', 'ZodError', '$ZodError']);
const TRANSIENT_CODES = new Set(['ETIMEDOUT', 'ECONNRESET', 'ECONNREFUSED', 'EAI_AGAIN', 'EPIPE', 'ENETUNREACH', 'EHOSTUNREACH', 'ECONNABORTED', 'UND_ERR_SOCKET', 'UND_ERR_CONNECT_TIMEOUT']);

function field(error: unknown, name: string): unknown {
  return typeof error === 'object' && error !== null ? (error as Record<string, unknown>)[name] : undefined;
}

function httpStatus(error: unknown): number | undefined {
  for (const candidate of [field(error, 'status'), field(error, 'statusCode'), field(field(error, 'response'), 'status')]) {
    if (typeof candidate === 'number' && candidate >= 100 && candidate < 600) return candidate;
  }
  return undefined;
}

/** Marker error for a handler that ran past its timeout. */
export class JobTimeoutError extends Error {
  override name = 'JobTimeoutError';
}

/** Marker error for a job whose type no handler is registered for. */
export class UnknownJobTypeError extends Error {
  override name = 'UnknownJobTypeError';
}

/**
 * The default classifier:
 * - `PermanentError`, `ValidationError` (and errors named `ValidationError`, `ZodError` or `$ZodError`) and HTTP-style
 * *   statuses 400/401/403/404/405/410/413/415/422: not retried (409 is retried: an Idempotency-Key in use);
 * - a missing handler: `unknown-type`, not retried;
 * - timeouts, network codes (ETIMEDOUT, ECONNRESET, ECONNREFUSED, EAI_AGAIN, ...),
 *   408/429/5xx and anything else: retried; `RetryableError({ after })` sets the delay.
 *
 * @example
 * defaultClassifier(Object.assign(new Error('nope'), { status: 422 })) // { category: 'permanent', retry: false }
 */
export const defaultClassifier: ErrorClassifier = (error) => {
  if (error instanceof UnknownJobTypeError) return { category: 'unknown-type', retry: false };
  if (error instanceof PermanentError) return { category: 'permanent', retry: false };
  if (error instanceof ValidationError || VALIDATION_ERROR_NAMES.has(field(error, 'name'))) return { category: 'validation', retry: false };
  if (error instanceof JobTimeoutError) return { category: 'timeout', retry: true };
  if (error instanceof RetryableError) {
    const retryAfterMs = error.afterMs;
    return retryAfterMs === undefined ? { category: 'transient', retry: true } : { category: 'transient', retry: true, retryAfterMs };
  }
  const code = field(error, 'code');
  if (typeof code === 'string' && TRANSIENT_CODES.has(code)) {
    return { category: code === 'ETIMEDOUT' ? 'timeout' : 'transient', retry: true };
  }
  const status = httpStatus(error);
  if (status !== undefined) {
    if (status === 408) return { category: 'timeout', retry: true };
    if (PERMANENT_STATUS.has(status)) return { category: 'permanent', retry: false };
  }
  if (field(error, 'name') === 'AbortError' || field(error, 'name') === 'TimeoutError') return { category: 'timeout', retry: true };
  return { category: 'transient', retry: true };
};
