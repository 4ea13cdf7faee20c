/**
 * A fleet of demo workers that can be crashed one at a time. Two kinds: in
 * the demo's own process (embedded PGlite serves one process; a crash is
 * `worker.abandon()`), or child processes (a server; a crash is SIGKILL).
 */

/** How the demo crashes a worker. */
export type CrashKind = 'abandon' | 'sigkill';

/** What the ledger says about each kind of crash. */
export const CRASH_DESCRIPTION: Record<CrashKind, string> = {
  abandon:
    'in-process abandon: the worker stopped dead (no completion, no release, no more heartbeats); its leases expired and maintenance rescued the jobs',
  sigkill: 'worker processes killed with SIGKILL; their leases expired and maintenance rescued the jobs',
};

/** One crash. */
export interface CrashRecord {
  worker: string;
  /** Process id of a killed worker process. */
  pid?: number;
  /** Jobs the worker held (state active, locked by it) when it died. */
  inFlight: number;
  /** Milliseconds since the workers started. */
  atMs: number;
  /** The worker started in its place. */
  replacement: string;
}

/** Settings every worker of the fleet uses. */
export interface FleetSettings {
  schema: string;
  workers: number;
  concurrency: number;
  leaseMs: number;
  pollMs: number;
  rescueMs: number;
}

/** Workers the demo can start, crash and stop. */
export interface Fleet {
  readonly crashKind: CrashKind;
  /** Starts the workers; resolves when all of them are claiming jobs. */
  start(): Promise<void>;
  /** Workers alive now. */
  alive(): number;
  /**
   * Crashes the worker holding the most jobs and starts a replacement.
   * Resolves to undefined when no worker holds a job right now.
   */
  crashOne(elapsedMs: number): Promise<CrashRecord | undefined>;
  /** Stops the living workers gracefully. */
  stop(): Promise<void>;
  /** Emergency stop (Ctrl-C): kills whatever is left, at once. */
  kill(): void;
}
