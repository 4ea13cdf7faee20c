import { ValidationError } from './errors.ts';

/** Settings of one queue (`createMailroom({ queues: { email: { owner: 'growth' } } })`). */
export interface QueueSettings {
  /** The team that owns the queue: labels its metrics, alerts and dead letters. */
  owner?: string;
}

/**
 * Checks the `queues` option: an object of queue name → settings, each
 * owner a non-empty string (it becomes a Prometheus label value).
 *
 * @example
 * checkQueueSettings({ email: { owner: 'growth' } });
 */
export function checkQueueSettings(queues: unknown): Record<string, QueueSettings> {
  if (queues === undefined) return {};
  if (typeof queues !== 'object' || queues === null || Array.isArray(queues)) {
    throw new ValidationError(`queues must be an object of queue name -> settings, e.g. { email: { owner: 'growth' } }; got ${Array.isArray(queues) ? 'an array' : queues === null ? 'null' : typeof queues}`, [
      { path: 'queues', message: 'not an object' },
    ]);
  }
  for (const [queue, settings] of Object.entries(queues)) {
    if (typeof settings !== 'object' || settings === null || Array.isArray(settings)) {
      throw new ValidationError(`queues.${queue} must be an object such as { owner: 'growth' }`, [{ path: `queues.${queue}`, message: 'not an object' }]);
    }
    const { owner } = settings as { owner?: unknown };
    if (owner !== undefined && (typeof owner !== 'string' || owner.trim() === '' || owner.length > 200)) {
      throw new ValidationError(`queues.${queue}.owner must be the owning team's name (a non-empty string of at most 200 characters), got ${typeof owner === 'string' ? JSON.stringify(owner.slice(0, 40)) : typeof owner}`, [
        { path: `queues.${queue}.owner`, message: 'invalid' },
      ]);
    }
  }
  return { ...(queues as Record<string, QueueSettings>) };
}
