/**
 * Events a target refused for good (see RefusedEventError), parked: recorded
 * in `relay_parked` by the relay holding the target's lease, and left out of
 * every later batch of that target until its cursor has passed them.
 */
import type { Driver } from '../storage/driver.ts';
import type { RelayQueries } from './relay-queries.ts';
import { storedRowOf } from './stored-event.ts';
import type { RelayedEvent } from './target.ts';

/** A parked event, as the relay reports it. */
export interface ParkedEvent {
  target: string;
  eventId: string;
  type: string;
  position: string;
  reason: string;
}

/**
 * One target's parked events past its cursor (positions, with their xids).
 * Loaded when the relay takes the target's lease; rounds leave them out.
 *
 * @example
 * const parked = new ParkedEvents(driver, queries, 'nats:orders');
 * await parked.load();
 * const events = parked.without(batch);
 */
export class ParkedEvents {
  /** Position → xid of the parked events the cursor may not have passed yet. */
  readonly #ahead = new Map<string, bigint>();

  constructor(
    private readonly driver: Driver,
    private readonly queries: RelayQueries,
    private readonly target: string,
  ) {}

  /** Reads the target's parked events past its cursor (a relay that took the lease over learns of another's). */
  async load(): Promise<void> {
    const { rows } = await this.driver.run<{ position: string; xid: string }>(this.queries.parkedAhead, [this.target]);
    this.#ahead.clear();
    for (const r of rows) this.#ahead.set(r.position, BigInt(r.xid));
  }

  /** The events of a batch that are not parked (the batch itself when none is). */
  without<E extends RelayedEvent>(events: E[]): E[] {
    if (this.#ahead.size === 0) return events;
    return events.filter((e) => !this.#ahead.has(e.position));
  }

  /**
   * Parks `event` with `reason`, fenced by the lease: `'lost'` when the lease
   * was lost (nothing written), `'again'` when this relay had parked it
   * already (it should never have been offered again: the caller treats that
   * as a failure, not as progress), else `'parked'`.
   */
  async park(event: RelayedEvent, reason: string, holder: string, token: string): Promise<'parked' | 'again' | 'lost'> {
    const row = storedRowOf(event);
    if (this.#ahead.has(row.position)) return 'again';
    const { rowCount } = await this.driver.run(this.queries.park, [this.target, holder, token, row.position, row.xid, row.id, row.type, reason, row.body]);
    if (rowCount === 0) return 'lost';
    this.#ahead.set(row.position, BigInt(row.xid));
    return 'parked';
  }

  /** Forgets the parked events the cursor has passed. */
  passed(cursor: { xid: bigint; position: bigint }): void {
    if (this.#ahead.size === 0) return;
    for (const [position, xid] of this.#ahead) {
      if (xid < cursor.xid || (xid === cursor.xid && BigInt(position) <= cursor.position)) this.#ahead.delete(position);
    }
  }
}
