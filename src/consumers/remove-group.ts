/**
 * Removing a consumer group that no longer runs: its subscription goes (the
 * fan-out stops making jobs for it), its jobs nobody will run are cancelled
 * and its inbox keys deleted. Its dead letters stay, for the dead-letter queue
 * and retention.
 */
import { MailroomError, ValidationError } from '../errors.ts';
import type { ConsumerSource } from '../brokers/source.ts';
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
  /** With a `source`: what the source deleted on the broker, as it says it; else null. */
  broker: string | null;
}

/** Options of `consumerGroups.remove`. */
export interface RemoveGroupOptions {
  /** The group's broker source: its queue, durable consumer or stream group is deleted too (after the database part). */
  source?: ConsumerSource;
}

/** Consumer groups registered in the database. */
export interface ConsumerGroupsApi {
  /**
   * Removes a group that no longer runs: the fan-out stops making jobs for it,
   * its waiting jobs (and running ones whose lease expired) are cancelled, its
   * inbox keys deleted; its dead letters stay. Refuses while a job of the group
   * runs under a live lease. A consumer of the group started later registers
   * it anew, as a new group (with `from: 'earliest'`, every retained event
   * again: its inbox keys are gone). With `source` (the group's broker
   * source, not running), what the broker keeps for the group is deleted
   * too: its queue, durable consumer or stream group, with the messages
   * not yet taken.
   *
   * @example
   * const { removed, cancelledJobs } = await mailroom.consumerGroups.remove('billing-v1');
   * await mailroom.consumerGroups.remove('billing-v1', { source: natsSource({ url, stream: 'orders' }) });
   */
  remove(group: string, options?: RemoveGroupOptions): Promise<RemovedGroup>;
}

const BATCH = 5000;

/**
 * Removes `group`: refuses while a job of the group runs under a live lease
 * (stop its consumers first), then deletes the subscription in a transaction
 * that holds off the fan-out, and cancels and deletes what is left in batches.
 */
export async function removeConsumerGroup(driver: Driver, queries: ConsumerQueries, group: string, options: RemoveGroupOptions = {}): Promise<RemovedGroup> {
  assertGroupName(group, 'consumerGroups.remove');
  const source = options.source;
  if (source !== undefined && (typeof source !== 'object' || source === null || typeof source.remove !== 'function')) {
    throw new ValidationError(
      `consumerGroups.remove: source must be a broker source that can delete what it keeps (rabbitmqSource, natsSource or redisSource, or one with a remove() method), got ${source === null ? 'null' : typeof source}`,
      [{ path: 'source', message: 'no remove()' }],
    );
  }
  const queue = await driver.transaction(async (tx) => {
    await tx.run(queries.lockInternalCursor, [INTERNAL_TARGET]);
    const { rows: running } = await tx.run<{ n: number }>(queries.runningJobs, [queueOfGroup(group)]);
    if (running[0]!.n > 0) {
      throw new MailroomError(
        `consumerGroups.remove: group ${group} has ${running[0]!.n} job(s) running under a live lease, so a consumer of it still runs; stop every consumer of the group, then remove it`,
      );
    }
    const { rows } = await tx.run<{ queue: string }>(queries.removeGroup, [group]);
    return rows[0]?.queue ?? null;
  });
  let cancelledJobs = 0;
  let inboxKeys = 0;
  if (queue !== null) {
    cancelledJobs = await inBatches(BATCH, Infinity, () => driver.run(queries.cancelLeftJobs, [queue, BATCH]));
    inboxKeys = await inBatches(BATCH, Infinity, () => driver.run(queries.forgetGroupInbox, [group, BATCH]));
  }
  let broker: string | null = null;
  if (source?.remove) {
    try {
      broker = await source.remove({ group });
    } catch (error) {
      const done = queue === null ? 'the group was not registered in the database' : `the group left the database (${cancelledJobs} job(s) cancelled, ${inboxKeys} inbox key(s) deleted)`;
      throw new MailroomError(`consumerGroups.remove: ${done}, but deleting it on the broker failed: ${error instanceof Error ? error.message : String(error)}; run the removal again`, { cause: error });
    }
  }
  return { removed: queue !== null, cancelledJobs, inboxKeys, broker };
}
