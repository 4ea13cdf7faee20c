import type { CloudEventEnvelope } from '../events/envelope.ts';
import type { SafetyWarning, TargetCheckContext } from '../brokers/safety.ts';
import type { Queryable } from '../storage/driver.ts';

/** One event as the relay hands it to a target. */
export interface RelayedEvent {
  /** Its place in the outbox (publish order; per key, commit order). */
  readonly position: string;
  /** The publishing transaction's id (xid8, as text). */
  readonly xid: string;
  /** The wire form (CloudEvents 1.0 structured JSON). */
  readonly envelope: CloudEventEnvelope;
  /**
   * The envelope as JSON text, as the built-in broker targets send it. Set on
   * every event the relay reads (its envelope is then parsed from this text
   * on first use); an event made by hand may leave it out.
   */
  readonly body?: string;
}

/** What a target gets with each batch. */
export interface RelayContext {
  /**
   * The relay's transaction for this batch: the target's cursor advances in it
   * after `publish` resolves. A target that writes to this database (the
   * internal fan-out) writes through it, so its writes and the cursor commit
   * together; a broker target ignores it (the broker's confirm comes first, so
   * a crash in between publishes again: consumers deduplicate on the event id).
   */
  readonly tx: Queryable;
  /**
   * Set only for a `pipelined` target, when the relay sends this batch before
   * the batch before it is confirmed: that batch's last event. The target must
   * then store the batch's first event only if `after` is already stored (a
   * JetStream `Nats-Expected-Last-Msg-Id` of `after`, a Redis run that needs
   * `after`'s dedup key), each later event only if the one before it is, and
   * reject rather than fall back to anything weaker: the relay then publishes
   * the batch again, without `after`, once the batch before it is confirmed.
   */
  readonly after?: RelayedEvent;
  /**
   * Which outbox the batch comes from (the database system, the database and
   * the outbox table), set by the relay on every batch it reads; absent for
   * `parkedEvents.republish` and when the database does not say. Every batch
   * the relay hands a target starts where everything before it (in the
   * order of (`xid`, `position`)) was delivered or parked, so with this a target can
   * recognise events it took before by those two (the Redis target keeps no
   * key per event that way). Its form may change between versions: use it
   * as an opaque name.
   */
  readonly origin?: string;
  /**
   * Aborted when the relay gives up on this batch: its `stop()` timeout
   * passed with the publish still out. The relay then neither waits for the
   * publish nor moves the cursor past the batch, and leaves the target's lease
   * to run out, after which another relay publishes the batch again. A target
   * that can call its publish off (a `fetch` given this signal, a client's
   * abort) should, so that nothing of the batch lands after events the next
   * relay delivers; one that cannot may deliver late, and out of order with
   * those. Set on every batch a relay hands a target; absent for
   * `parkedEvents.republish`.
   *
   * @example
   * publish: async (events, { signal }) => {
   *   await fetch(url, { method: 'POST', body: JSON.stringify(events.map((e) => e.envelope)), signal });
   * }
   */
  readonly signal?: AbortSignal;
}

/**
 * Where a relay delivers events. `publish` resolves once the batch is safely
 * delivered (committed, confirmed) and rejects otherwise; the batch is then
 * retried. Events come in position order, which keeps per-key order.
 *
 * @example
 * const audit: RelayTarget = { name: 'audit', publish: async (events) => { await auditLog.append(events.map((e) => e.envelope)); } };
 */
export interface RelayTarget {
  /** Names the target's cursor: 1-128 letters, digits, `_ . : -`. `internal` is the fan-out's. */
  readonly name: string;
  /**
   * True for a target that does not use `context.tx` (a broker): the relay
   * then reads the next batch while this one is being confirmed, and moves the
   * cursor by its own fenced statement after the confirm. Default false.
   */
  readonly readAhead?: boolean;
  /**
   * True for a `readAhead` target that can make a batch conditional on the
   * one before it (see {@link RelayContext.after}): the relay then sends batch
   * k+1 as soon as it is read, while the broker still confirms batch k, instead
   * of waiting for that confirm. Default false.
   */
  readonly pipelined?: boolean;
  /**
   * Gets the target ready before its first batch (the NATS target connects
   * and declares its stream, so a source of that stream can start once
   * `relay.start()` resolves); `relay.start()` awaits it. A failure is
   * reported as the relay's `error` and the first publish tries again.
   */
  start?(context: TargetCheckContext): Promise<void>;
  publish(events: readonly RelayedEvent[], context: RelayContext): Promise<void>;
  /** Broker settings that break a guarantee; the relay logs them at start (`warning` event), `mailroom doctor` prints them. */
  check?(context: TargetCheckContext): Promise<SafetyWarning[]>;
  /** Closes the target's connections; the relay calls it when it stops. */
  close?(): Promise<void>;
}
