const CANCEL = Symbol.for('mailroom.cancel');

/** The value `cancel(reason)` returns; a handler returns it to end its job as cancelled. */
export interface Cancel {
  readonly [CANCEL]: true;
  readonly reason: string;
}

/**
 * Return `cancel(reason)` from a handler to end the job as `cancelled`: not
 * completed, not failed, never retried and not a dead letter, with `reason`
 * in its history (the work is no longer wanted: the order was refunded, the
 * user deleted). Writes made through `ctx.tx` commit with it.
 *
 * @example
 * if (order.refunded) return cancel(`order ${order.id} was refunded`);
 */
export function cancel(reason: string): Cancel {
  if (typeof reason !== 'string' || reason.trim() === '') throw new TypeError('cancel(reason): reason must be a non-empty string saying why the job is no longer wanted');
  return { [CANCEL]: true, reason: reason.slice(0, 10_000) };
}

/** True when a handler's return value is a {@link Cancel}. */
export function isCancel(value: unknown): value is Cancel {
  return typeof value === 'object' && value !== null && (value as Record<symbol, unknown>)[CANCEL] === true;
}
