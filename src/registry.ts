import type { JobDefinition } from './define.ts';

const definitions = new Map<string, JobDefinition<unknown, unknown>>();

/** Remembers a job definition by name, so a worker knows its retry policy, timeout and classifier. */
export function registerJob(def: JobDefinition<unknown, unknown>): void {
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
