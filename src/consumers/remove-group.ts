/**
 * Removing a consumer group that no longer runs: its subscription goes (the
 * fan-out stops making jobs for it), its jobs nobody will run are cancelled
 * and its inbox keys deleted. Its dead letters stay, for the dead-letter queue
 * and retention.
 */
import { MailroomError } from '../errors.ts';
import { INTERNAL_TARGET } from '../relay/internal-target.ts';
import { inBatches } from '../storage/batches.ts';
import type { Driver } from '../storage/driver.ts';
import { assertGroupName, queueOfGroup } from './options.ts';
import type { ConsumerQueries } from './consumer-queries.ts';

/** What `consumerGroups.remove` did. */
export interface RemovedGroup {
  /** False when no such group was registered (nothing else was done). */
  removed: boolean;
  /** Its waiting jobs, and running ones whose lease had expired, now cancelled. */
  cancelledJobs: number;
  /** Its inbox keys deleted. */
  inboxKeys: number;
}

/** Consumer groups registered in the database. */
export interface ConsumerGroupsApi {
  /**
   * Removes a group that no longer runs: the fan-out stops making jobs for it,
   * its waiting jobs (and running ones whose lease expired) are cancelled, its
   * inbox keys deleted; its dead letters stay. Refuses while a job of the group
   * runs under a live lease. A consumer of the group started later registers
   * it anew, as a new group (with `from: 'earliest'`, every retained event
   * again: its inbox keys are gone). A broker source's queue or subscription
   * is the broker's: delete it there.
   *
   * @example
   * const { removed, cancelledJobs } = await mailroom.consumerGroups.remove('billing-v1');
   */
  remove(group: string): Promise<RemovedGroup>;
}

const BATCH = 5000;

/**
 * Removes `group`: refuses while a job of the group runs under a live lease
 * (stop its consumers first), then deletes the subscription in a transaction
 * that holds off the fan-out, and cancels and deletes what is left in batches.
 */
export async function removeConsumerGroup(driver: Driver, queries: ConsumerQueries, group: string): Promise<RemovedGroup> {
  assertGroupName(group, 'consumerGroups.remove');
  const queue = await driver.transaction(async (tx) => {
    await tx.query(queries.lockInternalCursor.text, [INTERNAL_TARGET]);
    const { rows: running } = await tx.query<{ n: number }>(queries.runningJobs.text, [queueOfGroup(group)]);
    if (running[0]!.n > 0) {
      throw new MailroomError(
        `consumerGroups.remove: group ${group} has ${running[0]!.n} job(s) running under a live lease, so a consumer of it still runs; stop every consumer of the group, then remove it`,
      );
    }
    const { rows } = await tx.query<{ queue: string }>(queries.removeGroup.text, [group]);
    return rows[0]?.queue ?? null;
  });
  if (queue === null) return { removed: false, cancelledJobs: 0, inboxKeys: 0 };
  const cancelledJobs = await inBatches(BATCH, Infinity, () => driver.run(queries.cancelLeftJobs, [queue, BATCH]));
  const inboxKeys = await inBatches(BATCH, Infinity, () => driver.run(queries.forgetGroupInbox, [group, BATCH]));
  return { removed: true, cancelledJobs, inboxKeys };
}
