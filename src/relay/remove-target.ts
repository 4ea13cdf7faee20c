/**
 * Retiring a relay target that no longer runs: its cursor row goes, so it no
 * longer holds outbox retention back, and so do the events parked for it.
 */
import { MailroomError, ValidationError } from '../errors.ts';
import type { Driver } from '../storage/driver.ts';
import { INTERNAL_TARGET } from './internal-target.ts';
import type { RemoveTargetQueries } from './remove-target-queries.ts';

/** What `relayTargets.remove` did. */
export interface RemovedTarget {
  /** False when the target had no cursor (no relay ever ran it, or it was removed already). */
  removed: boolean;
  /** Events parked for the target, deleted with it. */
  parked: number;
}

/** Relay targets known to the database (their cursors). */
export interface RelayTargetsApi {
  /**
   * Removes a target no relay runs any more: its cursor (which holds outbox
   * retention back while it exists) and the events parked for it. Refused
   * while a relay holds the target's lease (stop it first), and for the
   * internal target while groups of internal events exist (remove those with
   * `consumerGroups.remove`). A relay that runs the target later starts it
   * anew, at the oldest event the outbox retains.
   *
   * @example
   * const { removed, parked } = await mailroom.relayTargets.remove('rabbitmq:orders-old');
   */
  remove(target: string): Promise<RemovedTarget>;
}

/** Removes `target`'s cursor and parked events in one transaction (see {@link RelayTargetsApi.remove}). */
export async function removeRelayTarget(driver: Driver, queries: RemoveTargetQueries, target: string): Promise<RemovedTarget> {
  if (typeof target !== 'string' || target === '') {
    throw new ValidationError(`relayTargets.remove: target must be a target's name as mailroom status shows it (e.g. "nats:orders"), got ${JSON.stringify(target)}`, [
      { path: 'target', message: 'not a name' },
    ]);
  }
  return driver.transaction(async (tx) => {
    const { rows } = await tx.run<{ holder: string | null; held: boolean }>(queries.lockCursor, [target]);
    const cursor = rows[0];
    if (cursor?.held) {
      throw new MailroomError(`relayTargets.remove: a relay (${cursor.holder}) runs target ${target} now; stop every relay that delivers to it, then remove it`);
    }
    if (target === INTERNAL_TARGET) {
      const { rows: groups } = await tx.query<{ name: string }>(queries.internalGroups.text);
      if (groups.length > 0) {
        throw new MailroomError(
          `relayTargets.remove: the internal target feeds the consumer groups ${groups.map((g) => g.name).join(', ')}; remove those groups first (consumerGroups.remove, or mailroom groups remove)`,
        );
      }
    }
    const parked = await tx.run(queries.deleteParked, [target]);
    if (cursor !== undefined) await tx.run(queries.deleteCursor, [target]);
    return { removed: cursor !== undefined, parked: parked.rowCount };
  });
}
