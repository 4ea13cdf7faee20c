/**
 * Whether publishers should send NOTIFY: a sleeping listener records itself
 * in `wake_listeners`, and the trigger notifies only while a row is there.
 *
 * PostgreSQL commits notifying transactions one at a time (a lock held
 * through the WAL flush), so a NOTIFY in every publish caps concurrent
 * publishers at what one disk flush after another allows. So:
 * - a listener that finds nothing to do records itself, then keeps looking
 *   until every transaction that was running at that moment has ended, and
 *   once more after that (one of them may have checked the table just before
 *   the row was there, and will send nothing when it commits);
 * - a listener woken more than {@link BUSY_NOTIFIES} times within
 *   {@link BUSY_WINDOW_MS} takes its row away and polls every
 *   {@link FAST_POLL_MS} instead, until it has found nothing for
 *   {@link QUIET_MS}: then it records itself again.
 * Polling at `pollMs` stays the safety net; a row left by a crashed listener
 * only brings back a NOTIFY per publish, and is dropped after {@link STALE_MINUTES}
 * by the next listener that records itself, on any channel.
 */
import { stopController } from '../stop-controller.ts';
import type { Driver, NamedQuery } from './driver.ts';
import { namedQueries } from './named.ts';
import { MailroomError } from '../errors.ts';
import { CANCEL_WAIT_MS, MAX_TIMER_MS, unlessAborted, within } from '../time-limit.ts';

const ignore = (): void => {};

/** Notifications within {@link BUSY_WINDOW_MS} past which a listener stops asking for them. */
export const BUSY_NOTIFIES = 50;
export const BUSY_WINDOW_MS = 100;
/** How often a listener that stopped asking for notifications looks for work. */
export const FAST_POLL_MS = 5;
/** How long a polling listener finds nothing before it asks for notifications again. */
export const QUIET_MS = 100;
/** The longest wait between two looks while transactions that may have missed the row are running. */
const SETTLE_MAX_MS = 200;
/** A sleeping listener refreshes its row at least this often; rows older than twice this are dropped. */
const REFRESH_MS = 60_000;
const STALE_MINUTES = 10;

/** The statements of the wake gate, for one quoted schema. */
export interface WakeGateQueries {
  register: NamedQuery;
  snapshot: NamedQuery;
  settled: NamedQuery;
  unregister: NamedQuery;
}

/** Builds the wake-gate statements for a quoted schema name. */
export function wakeGateQueries(quotedSchema: string): WakeGateQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    // $1 channels, $2 listener. Records (or refreshes) a sleeping listener; drops rows of listeners gone for
    // long on every channel (a queue whose only worker crashed has nobody else to drop its row).
    register: q(
      'wake_register',
      `WITH stale AS (DELETE FROM ${s}.wake_listeners WHERE seen_at < now() - interval '${STALE_MINUTES} minutes')
       INSERT INTO ${s}.wake_listeners (channel, listener) SELECT c, $2 FROM unnest($1::text[]) AS c ORDER BY c
       ON CONFLICT (channel, listener) DO UPDATE SET seen_at = now()`,
    ),
    // Taken after the registration committed: its running transactions are those that may have missed the row.
    snapshot: q('wake_snapshot', `SELECT pg_current_snapshot()::text AS snapshot`),
    // $1 snapshot. True once none of its running transactions is still running.
    settled: q(
      'wake_settled',
      `SELECT NOT EXISTS (SELECT 1 FROM pg_snapshot_xip($1::pg_snapshot) AS x WHERE pg_xact_status(x) = 'in progress') AS settled`,
    ),
    // $1 channels, $2 listener
    unregister: q('wake_unregister', `DELETE FROM ${s}.wake_listeners WHERE channel = ANY ($1::text[]) AND listener = $2`),
  };
}

/**
 * One listener's row in `wake_listeners`, kept while it sleeps and taken
 * away while notifications come too fast to be worth their cost.
 *
 * @example
 * const gate = new WakeGate(driver, queries, ['outbox'], relayId, 1000, console.error);
 * // found nothing to do:
 * await waker.sleep(await gate.idle());
 */
export class WakeGate {
  private registered = false;
  private registeredAt = 0;
  /** The snapshot taken after registering, until its transactions have ended. */
  private settling: string | null = null;
  private settleDelay = FAST_POLL_MS;
  /** Polling instead of being notified, since notifications came fast. */
  private polling = false;
  private lastWorkAt = 0;
  private notifications: number[] = [];
  private chain: Promise<unknown> = Promise.resolve();
  private closed = false;
  /** False only while the listener's row is known not to be there (so a close has nothing to remove). */
  private rowMayExist = false;
  /** Aborted by {@link interrupt}: cancels the gate's own statement in flight (a registration waiting for a lock, say). */
  private readonly halt = stopController();

  constructor(
    private readonly driver: Driver,
    private readonly queries: WakeGateQueries,
    /** The rows' channels: `outbox` for a relay, `queue:<name>` per queue for a worker. */
    private readonly channels: readonly string[],
    private readonly listener: string,
    private readonly pollMs: number,
    private readonly report: (error: unknown) => void,
    /** How often a sleeping listener refreshes its row (tests shorten it). */
    private readonly refreshMs: number = REFRESH_MS,
  ) {}

  /** A NOTIFY arrived. Past {@link BUSY_NOTIFIES} in {@link BUSY_WINDOW_MS}, the row goes and the listener polls. */
  notified(): void {
    const now = Date.now();
    this.notifications.push(now);
    while (this.notifications.length > 0 && this.notifications[0]! < now - BUSY_WINDOW_MS) this.notifications.shift();
    if (this.notifications.length >= BUSY_NOTIFIES && this.registered && !this.closed) {
      this.notifications = [];
      this.polling = true;
      this.lastWorkAt = now;
      this.registered = false;
      this.settling = null;
      this.serialized(() => this.removeRow(this.halt.signal)).catch((error: unknown) => {
        if (!this.halt.signal.aborted) this.report(error);
      });
    }
  }

  /** The listener found work (a polling listener keeps polling while it does). */
  worked(): void {
    this.lastWorkAt = Date.now();
  }

  /**
   * A sleep the listener chose itself (waiting for a transaction that holds
   * work back, say), shortened to {@link FAST_POLL_MS} while it polls: no
   * NOTIFY would cut it short then.
   */
  capped(ms: number): number {
    return this.polling && Date.now() - this.lastWorkAt < QUIET_MS ? Math.min(ms, FAST_POLL_MS) : ms;
  }

  /**
   * The listener found nothing to do: returns how long it may sleep (a NOTIFY
   * may cut that short). Registers first when it is not registered, and keeps
   * the sleeps short until transactions that may have missed the row ended.
   */
  async idle(): Promise<number> {
    if (this.closed) return this.pollMs;
    const now = Date.now();
    if (this.polling && now - this.lastWorkAt < QUIET_MS) return FAST_POLL_MS;
    this.polling = false;
    try {
      if (!this.registered || now - this.registeredAt > this.refreshMs) {
        await this.serialized(() => this.addRow());
        if (this.closed) return this.pollMs;
        const { rows } = await this.driver.run<{ snapshot: string }>(this.queries.snapshot, [], { signal: this.halt.signal });
        this.registered = true;
        this.registeredAt = now;
        this.settling = rows[0]!.snapshot;
        this.settleDelay = FAST_POLL_MS;
        return FAST_POLL_MS; // look once more first
      }
      if (this.settling !== null) {
        const { rows } = await this.driver.run<{ settled: boolean }>(this.queries.settled, [this.settling], { signal: this.halt.signal });
        if (rows[0]!.settled) {
          // The last of them may have committed after the listener's last look: one more look.
          this.settling = null;
          return FAST_POLL_MS;
        } else {
          this.settleDelay = Math.min(SETTLE_MAX_MS, this.pollMs, this.settleDelay * 2);
          return this.settleDelay;
        }
      }
    } catch (error) {
      if (!this.halt.signal.aborted) this.report(error);
    }
    return Math.min(this.pollMs, this.refreshMs);
  }

  /**
   * The listener is stopping: a statement of the gate in flight (a
   * registration waiting for a lock on `wake_listeners`, say) is cancelled,
   * and none follows but {@link close}'s removal. Idempotent.
   */
  interrupt(): void {
    this.closed = true;
    this.halt.abort(new MailroomError(`listener ${this.listener} is stopping: its wake-up statement in flight was cancelled`));
  }

  /**
   * Takes the row away for good (the listener stops). A removal not done
   * within `limitMs` (a lock on the row, say) is cancelled and rejects: the
   * row is then left to the clean-up of stale listeners.
   */
  async close(limitMs = Number.POSITIVE_INFINITY): Promise<void> {
    this.interrupt();
    const signal = limitMs > MAX_TIMER_MS ? undefined : AbortSignal.timeout(limitMs);
    // After the statement in flight ended (cancelled or not), so that it cannot record the row after its removal.
    const unregister = this.serialized(() => (this.rowMayExist ? this.removeRow(signal) : Promise.resolve()));
    try {
      await (signal ? unlessAborted(unregister, signal) : unregister);
    } catch (error) {
      if (!signal?.aborted) throw error;
      // The removal's statement is cancelled on the server: it ends there before the stop goes on (or the wait runs out).
      await within(unregister.then(ignore, ignore), CANCEL_WAIT_MS, undefined);
      throw new MailroomError(
        `listener ${this.listener} (${this.channels.join(', ')}) stopped without removing its row from wake_listeners: the removal did not end within ${limitMs} ms (what was left of the stop's timeout, at least a second; ` +
          `a lock on the row, say) and was cancelled. The row is dropped by the next listener that records itself after ${STALE_MINUTES} minutes; until then enqueues notify a listener that is gone`,
      );
    }
    this.registered = false;
  }

  /** Records (or refreshes) the listener's row; cancelled by {@link interrupt}. */
  private async addRow(): Promise<void> {
    const before = this.rowMayExist;
    this.rowMayExist = true;
    try {
      await this.driver.run(this.queries.register, [this.channels, this.listener], { signal: this.halt.signal });
    } catch (error) {
      // Cancelled, the statement inserted nothing (unless its connection was lost at that moment after the commit:
      // the row then goes with the stale ones); failed otherwise (a lost connection), it may have committed.
      if (this.halt.signal.aborted) this.rowMayExist = before;
      throw error;
    }
  }

  /** Takes the listener's row away. */
  private async removeRow(signal?: AbortSignal): Promise<void> {
    await this.driver.run(this.queries.unregister, [this.channels, this.listener], { signal });
    this.rowMayExist = false;
  }

  private serialized<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.chain.then(fn, fn);
    this.chain = run.catch(() => undefined); // each caller reports its own failure
    return run;
  }
}
