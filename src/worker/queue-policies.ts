import type { RetryPolicy } from '../retry/backoff.ts';
import type { ErrorClassifier } from '../retry/classify.ts';

/** How the worker retries, classifies and times out the jobs of one queue. */
export interface QueuePolicy {
  retry: RetryPolicy;
  classify: ErrorClassifier;
  timeoutMs: number | null;
}

const policies = new Map<string, QueuePolicy>();

/**
 * Sets the policy of every job in `queue`, ahead of the job type's own
 * definition. Consumer groups use it: their jobs carry event types, and the
 * group's options say how to retry them. The last registration wins.
 */
export function registerQueuePolicy(queue: string, policy: QueuePolicy): void {
  policies.set(queue, policy);
}

/** The policy registered for `queue`, if any. */
export function findQueuePolicy(queue: string): QueuePolicy | undefined {
  return policies.get(queue);
}
