import type { Driver, NamedQuery } from '../storage/driver.ts';

interface Asked {
  key: string;
  resolve: (seen: boolean) => void;
  reject: (error: unknown) => void;
}

/**
 * Answers "has this group handled the event already?" for many handlers with
 * one statement: keys asked while a lookup is in flight (or in the same turn
 * of the event loop) go together in the next one. A consumer's handlers start
 * in bursts as the worker claims, so a burst costs one round trip.
 */
export class InboxLookup {
  private asked: Asked[] = [];
  private looking: Promise<void> | undefined;

  constructor(
    private readonly driver: Driver,
    /** $1 group, $2 keys: returns `event_id` of the keys present. */
    private readonly query: NamedQuery,
    private readonly group: string,
    private readonly maxBatch = 1000,
  ) {}

  /** Resolves true when the group's inbox holds `key`. */
  seen(key: string): Promise<boolean> {
    return new Promise((resolve, reject) => {
      this.asked.push({ key, resolve, reject });
      this.looking ??= this.lookLoop();
    });
  }

  private async lookLoop(): Promise<void> {
    try {
      await new Promise<void>((resolve) => setImmediate(resolve));
      while (this.asked.length > 0) {
        const batch = this.asked.splice(0, this.maxBatch);
        try {
          const { rows } = await this.driver.run<{ event_id: string }>(this.query, [this.group, batch.map((a) => a.key)]);
          const present = new Set(rows.map((r) => r.event_id));
          for (const a of batch) a.resolve(present.has(a.key));
        } catch (error) {
          for (const a of batch) a.reject(error);
        }
      }
    } finally {
      this.looking = undefined;
    }
  }
}
