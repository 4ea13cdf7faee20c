import { MailroomError } from '../errors.ts';
import { isUuid } from '../ids.ts';
import { findJob } from '../registry.ts';
import type { Driver } from '../storage/driver.ts';
import type { AdminQueries } from './admin-queries.ts';
import type { JobState } from './get.ts';

/** What `jobs.cancel` / `jobs.retry` did. */
export interface JobActionResult {
  /** True when the job changed state. */
  changed: boolean;
  /** The job's state afterwards; undefined when there is no such job. */
  state: JobState | undefined;
}

async function currentState(driver: Driver, queries: AdminQueries, id: string): Promise<JobState | undefined> {
  const { rows } = await driver.run<{ state: JobState }>(queries.stateOf, [id]);
  return rows[0]?.state;
}

/**
 * Cancels a waiting (scheduled, available, retrying) or dead job. An active job
 * is not interrupted: `changed` is false and `state` says `active`.
 */
export async function cancelJob(driver: Driver, queries: AdminQueries, id: string): Promise<JobActionResult> {
  if (!isUuid(id)) return { changed: false, state: undefined };
  const { rowCount } = await driver.run(queries.cancel, [id]);
  if (rowCount > 0) return { changed: true, state: 'cancelled' };
  return { changed: false, state: await currentState(driver, queries, id) };
}

/**
 * Runs a job again now: a waiting job skips the rest of its delay; a dead or
 * cancelled job gets a fresh budget of attempts (its job type's `maxAttempts`)
 * and of `maxAge`, keeping its history. Refused with an error naming the holder
 * when its dedup key belongs to an unfinished job now (the key is unique among those).
 */
export async function retryJob(driver: Driver, queries: AdminQueries, id: string): Promise<JobActionResult> {
  if (!isUuid(id)) return { changed: false, state: undefined };
  const { rows } = await driver.run<{ type: string; max_attempts: number }>(queries.retryBudgetOf, [id]);
  const row = rows[0];
  if (!row) return { changed: false, state: undefined };
  const budget = findJob(row.type)?.retry.maxAttempts ?? row.max_attempts;
  let rowCount: number;
  try {
    ({ rowCount } = await driver.run(queries.retry, [id, budget]));
  } catch (error) {
    throw (await keyHeldError(driver, queries, id, error)) ?? error;
  }
  if (rowCount > 0) return { changed: true, state: 'available' }; // the retry statement always sets it
  return { changed: false, state: await currentState(driver, queries, id) };
}

/** The error for a retry refused by the dedup key's unique index: which job holds the key, and what to do. */
async function keyHeldError(driver: Driver, queries: AdminQueries, id: string, error: unknown): Promise<MailroomError | undefined> {
  if ((error as { code?: unknown }).code !== '23505') return undefined;
  const { rows } = await driver.run<{ id: string; state: string; dedup_key: string }>(queries.dedupHolderOf, [id]);
  const holder = rows[0];
  if (!holder) return undefined;
  return new MailroomError(
    `jobs.retry(${id}): its dedup key "${holder.dedup_key}" belongs to job ${holder.id} (${holder.state}) now, and only one unfinished job may hold a key; wait for that job to finish or cancel it, then retry this one`,
    { cause: error },
  );
}
