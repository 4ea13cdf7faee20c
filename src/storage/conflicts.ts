/**
 * True for PostgreSQL's verdicts on transactions that collided with another
 * (deadlock_detected 40P01, serialization_failure 40001): the transaction was
 * rolled back and running it again is the expected remedy.
 *
 * @example
 * if (isConcurrencyConflict(error)) return retryNow();
 */
export function isConcurrencyConflict(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === '40P01' || code === '40001';
}
