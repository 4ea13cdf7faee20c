import type { Driver, NamedQuery } from '../storage/driver.ts';
import { CoalescingBatch } from '../storage/coalescing-batch.ts';

/**
 * Answers "has this group handled the event already?" for many handlers with
 * one statement: keys asked while a lookup is in flight (or in the same turn
 * of the event loop) go together in the next one. A consumer's handlers start
 * in bursts as the worker claims, so a burst costs one round trip.
 */
export class InboxLookup {
  private readonly batches: CoalescingBatch<string, boolean>;

  constructor(
    driver: Driver,
    /** $1 group, $2 keys: returns `event_id` of the keys present. */
    query: NamedQuery,
    group: string,
    maxBatch = 1000,
  ) {
    this.batches = new CoalescingBatch(async (keys) => {
      const { rows } = await driver.run<{ event_id: string }>(query, [group, keys]);
      const present = new Set(rows.map((r) => r.event_id));
      return keys.map((key) => present.has(key));
    }, maxBatch);
  }

  /** Resolves true when the group's inbox holds `key`. */
  seen(key: string): Promise<boolean> {
    return this.batches.add(key);
  }
}
