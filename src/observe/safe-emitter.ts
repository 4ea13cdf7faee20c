import { EventEmitter } from 'node:events';

/** An event map as `EventEmitter<T>` takes it: event name → listener arguments. */
export type EventMap<T> = Record<keyof T, unknown[]>;

/**
 * An `EventEmitter` whose listeners cannot break the code that emits: a
 * listener that throws (or returns a promise that rejects) is reported with
 * `console.error` and the other listeners still run. `error` with no listener
 * does not throw either; the emitters check `listenerCount('error')` and log.
 *
 * @example
 * class Worker extends SafeEmitter<{ completed: [id: string] }> {}
 */
export class SafeEmitter<T extends EventMap<T>> extends EventEmitter<T> {}

// Replaces emit on the prototype: the typed signature of EventEmitter<T>['emit'] stays as it is.
SafeEmitter.prototype.emit = function safeEmit(this: EventEmitter, eventName: string | symbol, ...args: unknown[]): boolean {
  const listeners = this.rawListeners(eventName) as Array<(...a: unknown[]) => unknown>;
  if (listeners.length === 0) return false;
  for (const listener of listeners) {
    try {
      const result = listener.apply(this, args);
      if (result !== null && typeof result === 'object' && typeof (result as PromiseLike<unknown>).then === 'function') {
        (result as PromiseLike<unknown>).then(undefined, (error: unknown) => listenerFailed(eventName, error));
      }
    } catch (error) {
      listenerFailed(eventName, error);
    }
  }
  return true;
};

function listenerFailed(eventName: string | symbol, error: unknown): void {
  const message = error instanceof Error ? error.message : String(error);
  console.error(`[mailroom] a listener of "${String(eventName)}" threw (processing goes on): ${message}`);
}
