/**
 * What the reliability test process and its mailroom processes
 * (test/reliability/node-process.ts) share: the job and event definitions,
 * the process configuration and the lines a process prints.
 */
import { defineEvent, defineJob, type Duration, type RetryOptions } from '../../src/index.ts';
import type { StallCheck } from '../../src/storage/stalled-statements.ts';

export type NodeRole = 'jobs' | 'inproc' | 'relay' | 'rabbit';

export interface NodeProcessConfig {
  url: string;
  schema: string;
  roles: NodeRole[];
  appPrefix: string;
  concurrency: number;
  lease: Duration;
  relayLease: Duration;
  rescueInterval: Duration;
  pollInterval: Duration;
  /** The handler's pause, picked in [min, max] ms (kills and pauses land while its transaction is open). */
  sleepMs: [number, number];
  retry: RetryOptions;
  rabbit: { url: string; exchange: string; queue: string } | null;
  /** The PostgreSQL driver's check of stalled connections, shortened for a scenario that stalls them (default: the driver's). */
  stallCheck?: StallCheck;
}

/** The stall check of a scenario that stalls connections: 15 s would outlast the fault phase. */
export const QUICK_STALL_CHECK: StallCheck = { afterMs: 1_000, everyMs: 250, answerMs: 3_000 };

export interface JobPayload {
  op: string;
  key: string | null;
  seq: number | null;
  failFirst: boolean;
}

export interface EventPayload {
  op: string;
  key: string;
  seq: number;
}

export type NodeProcessLine =
  | { event: 'ready'; pid: number }
  | { event: 'stale'; id: string; attempt: number }
  | { event: 'held-back'; waiting: number }
  | { event: 'delivered'; target: string; count: number }
  | { event: 'error'; role: NodeRole; message: string };

/** The definitions both sides use (the test process enqueues and publishes them). */
export const relJob = (retry: RetryOptions) => defineJob<JobPayload>('rel.job', { queue: 'rel', retry });
export const relEvent = defineEvent<EventPayload>('rel.noted', { version: 1 });
export const INPROC_GROUP = 'inproc';
export const RABBIT_GROUP = 'rabbit';

