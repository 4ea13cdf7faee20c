/**
 * Running a test's jobs and events to the end: a real worker (or consumer
 * group and relay) on the test's database, stopped once nothing it could run
 * is left. Retries, snoozes, ordering keys, the inbox and the dead-letter
 * queue behave as in production, because they are production's code.
 */
import type { Duration } from '../duration.ts';
import { toMilliseconds } from '../duration.ts';
import { MailroomError, ValidationError } from '../errors.ts';
import type { Mailroom } from '../mailroom.ts';
import type { ConsumerOptions } from '../consumers/options.ts';
import type { WorkerOptions } from '../worker/options.ts';
import type { JobEventRef } from '../observe/lifecycle.ts';
import { runTestingQuery } from './queries.ts';

/** How a drain ends: more than it took is a test bug (a handler that keeps snoozing, a job behind an open transaction). */
interface DrainLimits {
  /**
   * Also run jobs that wait for a later time (scheduled, retrying after a
   * failure, snoozed): their run time is moved to now, so retries happen at
   * once and a job ends completed or dead. Default false.
   */
  runScheduled?: boolean;
  /** Throws when work is still due after this long. Default `'30s'`. */
  timeout?: Duration;
}

/** Options of {@link runJobs}: a worker's, plus how the drain ends. */
export interface RunJobsOptions extends WorkerOptions, DrainLimits {}

/** Options of {@link deliverEvents}: a consumer group's (internal events only), plus how the drain ends. */
export interface DeliverEventsOptions extends Omit<ConsumerOptions, 'source'>, DrainLimits {}

/** One failed attempt seen during a drain. */
export interface DrainFailure {
  id: string;
  type: string;
  attempt: number;
  category: string;
  message: string;
  /** True when the job went to the dead-letter queue. */
  dead: boolean;
}

/** What a drain did, counted from the worker's own events. */
export interface DrainResult {
  /** Handler runs that completed. */
  completed: number;
  /** Failed attempts that will be retried. */
  retrying: number;
  /** Jobs sent to the dead-letter queue. */
  dead: number;
  snoozed: number;
  /** Jobs whose handler returned `cancel(reason)` (runJobs only: for an event, cancel() counts as completed). */
  cancelled: number;
  /** Events acknowledged without running a handler: their inbox key existed (deliverEvents only). */
  duplicates: number;
  /** Every failed attempt, in order. */
  failures: DrainFailure[];
}

/** What a drain drives: a worker or a consumer group (both emit the worker's events). */
interface Runner {
  start(): Promise<void>;
  stop(): Promise<void>;
  on(event: 'completed', listener: () => void): unknown;
  on(event: 'failed', listener: (job: JobEventRef, detail: { category: string; message: string; dead: boolean }) => void): unknown;
  on(event: 'snoozed', listener: () => void): unknown;
  on(event: 'cancelled', listener: () => void): unknown;
  on(event: 'error', listener: (error: unknown) => void): unknown;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Runs every job of the worker's queues that is due, and what those jobs
 * lead to, with a real worker; resolves once no job of those queues is due
 * or running. Jobs waiting for a later time (a retry's backoff, a snooze, a
 * `runAt`) are left unless `runScheduled`. Polls every 10 ms unless
 * `pollInterval` says otherwise.
 *
 * @example
 * await mailroom.enqueue(sendWelcome, { email: 'ada@example.com' });
 * const result = await runJobs(mailroom, { queues: ['email'], handlers: { [sendWelcome.name]: handle(sendWelcome, send) } });
 * assert.equal(result.completed, 1);
 */
export async function runJobs(mailroom: Mailroom, options: RunJobsOptions): Promise<DrainResult> {
  const { runScheduled, timeout, ...workerOptions } = options;
  const worker = mailroom.worker({ pollInterval: 10, ...workerOptions });
  return drain(mailroom, worker, workerOptions.queues ?? ['default'], { runScheduled, timeout, what: 'runJobs' });
}

/**
 * Delivers the outbox's events to one consumer group and runs its handlers
 * until nothing is left: a consumer group (starting at the `'earliest'`
 * retained event unless `from` says otherwise, so events published before it
 * count) and a relay of internal events, flushed until it delivers nothing
 * more (handlers may publish further events); when a relay of your own runs
 * and holds the internal target, until it has delivered every event. A
 * broker `source` is not taken: test those with the broker.
 *
 * @example
 * await mailroom.publish(orderPlaced, { orderId: 'o-1' });
 * const result = await deliverEvents(mailroom, { group: 'billing', handlers: { [orderPlaced.type]: handleEvent(orderPlaced, bill) } });
 * assert.equal(result.completed, 1);
 */
export async function deliverEvents(mailroom: Mailroom, options: DeliverEventsOptions): Promise<DrainResult> {
  if (typeof options === 'object' && options !== null && 'source' in options && (options as { source?: unknown }).source !== undefined) {
    throw new ValidationError('deliverEvents: a broker source is not taken; it delivers the outbox (internal events). Test a broker source against the broker.', [
      { path: 'source', message: 'not taken' },
    ]);
  }
  const { runScheduled, timeout, ...consumerOptions } = options;
  const consumer = mailroom.consumer({ from: 'earliest', pollInterval: 10, ...consumerOptions });
  const relay = mailroom.relay({ to: [], internal: true });
  let duplicates = 0;
  consumer.on('duplicate', () => duplicates++);
  try {
    const result = await drain(mailroom, consumer, [consumer.queue], {
      runScheduled,
      timeout,
      what: 'deliverEvents',
      pump: async () => {
        const { internal } = await relay.flush();
        if (internal?.leased === false) {
          // Another relay of this database holds the internal target: it delivers; wait while it has events to.
          const unpublished = (await mailroom.stats()).relay.internal?.unpublished ?? 0;
          return { moved: 0, waiting: unpublished > 0 };
        }
        return { moved: internal?.delivered ?? 0, waiting: internal?.heldBack === true };
      },
    });
    return { ...result, duplicates };
  } finally {
    await relay.stop();
  }
}

interface DrainSettings {
  runScheduled: boolean | undefined;
  timeout: Duration | undefined;
  what: string;
  /** Moves work into the queues (the relay's flush): how much it moved, and whether some waits behind an open transaction. */
  pump?: () => Promise<{ moved: number; waiting: boolean }>;
}

async function drain(mailroom: Mailroom, runner: Runner, queues: readonly string[], settings: DrainSettings): Promise<DrainResult> {
  const timeoutMs = toMilliseconds(settings.timeout ?? '30s', `${settings.what} timeout`);
  const result: DrainResult = { completed: 0, retrying: 0, dead: 0, snoozed: 0, cancelled: 0, duplicates: 0, failures: [] };
  let broken: unknown = null;
  runner.on('completed', () => result.completed++);
  runner.on('snoozed', () => result.snoozed++);
  runner.on('cancelled', () => result.cancelled++);
  runner.on('failed', (job, detail) => {
    if (detail.dead) result.dead++;
    else result.retrying++;
    result.failures.push({ id: job.id, type: job.type, attempt: job.attempt, category: detail.category, message: detail.message, dead: detail.dead });
  });
  runner.on('error', (error) => (broken ??= error));
  await runner.start();
  try {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (broken !== null) throw new MailroomError(`${settings.what}: the worker reported an error: ${describe(broken)}`, { cause: broken });
      const pumped = settings.pump ? await settings.pump() : { moved: 0, waiting: false };
      if (settings.runScheduled) await runTestingQuery(mailroom, 'runScheduledNow', [queues]);
      const left = await workLeft(mailroom, queues, settings.runScheduled === true);
      if (left.active === 0 && left.due === 0 && pumped.moved === 0 && !pumped.waiting) break;
      if (Date.now() >= deadline) {
        const behind = pumped.waiting ? '; committed events wait behind an open transaction' : '';
        throw new MailroomError(
          `${settings.what}: still ${left.due} job(s) due and ${left.active} running in ${queues.join(', ')} after ${timeoutMs} ms${behind}. ` +
            'A handler that always snoozes or fails (with runScheduled) never ends; raise timeout if the work is just slow.',
        );
      }
      await sleep(5);
    }
  } finally {
    await runner.stop();
  }
  return result;
}

/** With `later`, a job waiting for a later time counts as due too: one that a snooze or a failure sets back between the move to now and this count is not missed. */
async function workLeft(mailroom: Mailroom, queues: readonly string[], later: boolean): Promise<{ active: number; due: number }> {
  const rows = await runTestingQuery<{ active: number; due: number }>(mailroom, 'workLeft', [queues, later]);
  return { active: Number(rows[0]!.active), due: Number(rows[0]!.due) };
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
