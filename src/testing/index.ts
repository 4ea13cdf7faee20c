/**
 * mailroom/testing: a kit for testing code that uses mailroom, on the real
 * engine: an in-memory database per test, what was enqueued and published,
 * and jobs and events run to the end.
 *
 * @example
 * import { createTestMailroom, enqueuedJobs, runJobs } from 'mailroom/testing';
 */
export { createTestMailroom } from './test-mailroom.ts';
export { enqueuedJobs, publishedEvents } from './inspect.ts';
export type { EnqueuedJob, PublishedEvent } from './inspect.ts';
export { runJobs, deliverEvents } from './drain.ts';
export type { RunJobsOptions, DeliverEventsOptions, DrainResult, DrainFailure } from './drain.ts';
