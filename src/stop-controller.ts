import { setMaxListeners } from 'node:events';

/**
 * An AbortController for a component's stop, whose signal any number of
 * statements in flight may listen to at once (a busy worker has one for each
 * claim, completion, heartbeat and handler transaction). Past ten listeners
 * node would otherwise print a MaxListenersExceededWarning, "possible memory
 * leak", though each statement takes its listener off when it ends.
 *
 * @example
 * const halt = stopController();
 * await driver.run(query, params, { signal: halt.signal });
 */
export function stopController(): AbortController {
  const controller = new AbortController();
  setMaxListeners(0, controller.signal);
  return controller;
}
