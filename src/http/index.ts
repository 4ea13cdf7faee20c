/**
 * mailroom/http: the Idempotency-Key middleware, so a retried POST takes
 * effect once. Its work, jobs and events commit with the recorded response.
 *
 * @example
 * import { idempotency, idempotencyTx } from 'mailroom/http';
 */
export { idempotency, idempotencyTx } from './middleware.ts';
export type { IdempotencyOptions, IdempotencyMiddleware, IdempotentRequest } from './middleware.ts';
export { IdempotencyStore } from './store.ts';
export type { RecordedResponse, IdempotentOutcome } from './store.ts';
