import type { JobDefinition } from './define.ts';
import { ValidationError } from './errors.ts';

const definitions = new Map<string, JobDefinition<unknown, unknown>>();

/**
 * Remembers a job definition by name, so a worker knows its retry policy,
 * timeout and classifier. Defining a name again replaces the definition, but
 * not with another queue: a job type belongs to one queue (its jobs would go
 * where the workers of the other do not look).
 */
export function registerJob(def: JobDefinition<unknown, unknown>): void {
  const existing = definitions.get(def.name);
  if (existing !== undefined && existing.queue !== def.queue) {
    throw new ValidationError(
      `job ${def.name} is already defined for queue "${existing.queue}", not "${def.queue}": a job type belongs to one queue. Use the same queue, or give this job another name`,
      [{ path: 'queue', message: 'already defined for another queue' }],
    );
  }
  definitions.set(def.name, def);
}

/** The definition registered under `name` (the last one defined wins), if any. */
export function findJob(name: string): JobDefinition<unknown, unknown> | undefined {
  return definitions.get(name);
}

/** Every job definition registered in this process. */
export function registeredJobs(): IterableIterator<JobDefinition<unknown, unknown>> {
  return definitions.values();
}
