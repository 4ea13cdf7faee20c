/** A broker setting that breaks one of mailroom's guarantees, found by an adapter's `check()`. */
export interface SafetyWarning {
  /** Which adapter and object: e.g. `redis redis://127.0.0.1:6379 stream orders`. */
  readonly subject: string;
  /** A stable code for scripts: e.g. `redis-no-persistence`, `nats-duplicate-window`. */
  readonly code: string;
  /** What is wrong, what can go wrong because of it, and how to fix it. */
  readonly message: string;
}

/** What a target's `check()` is told about the relay that will use it. */
export interface TargetCheckContext {
  /**
   * The longest time after which the relay can publish an event again (a
   * relay that crashed after the broker's confirm, before its cursor
   * committed: another relay takes over after the lease). A broker's own
   * deduplication window shorter than this lets a duplicate through.
   */
  readonly republishHorizonMs: number;
  /**
   * The largest payload `publish` accepts (`createMailroom`'s
   * `maxPayloadBytes`), when known. A broker whose message size limit is
   * below it plus the envelope refuses such an event on every retry, and the
   * relay delivers nothing after it.
   */
  readonly maxPayloadBytes?: number;
  /**
   * The relay's `RelayContext.origin` (which outbox its batches come from):
   * null when the relay asked and its database did not say, absent when
   * unknown (`mailroom doctor`).
   */
  readonly origin?: string | null;
}

/** What an event adds to its payload on a broker, at most in practice: the envelope's attributes and the transport headers. */
export const ENVELOPE_ALLOWANCE_BYTES = 4096;
