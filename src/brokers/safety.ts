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
}
