/**
 * The one small interface every system under test implements. A workload only
 * talks to this: it never knows which queue it is measuring.
 */

/** What each enqueued job carries: its number in the run, and when it was enqueued (see `now()`). */
export interface BenchPayload {
  i: number;
  t: number;
}

/** Called by the system's worker at the start of each job's handler. */
export type OnJob = (payload: BenchPayload) => void;

export interface WorkerSettings {
  /** Jobs run at once, in total (how a system spends it is in its adapter, see `describe`). */
  concurrency: number;
}

export interface Adapter {
  /** Stable id (`mailroom`, `graphile-worker`, ...). */
  readonly id: string;
  /** Creates the system's storage (a fresh database, or a fresh Redis prefix) and installs its schema. */
  setup(): Promise<void>;
  /** Enqueues one job and resolves when the system has acknowledged it. */
  enqueueOne(payload: BenchPayload): Promise<void>;
  /** Enqueues many jobs with the system's bulk API, in one call. */
  enqueueMany(payloads: BenchPayload[]): Promise<void>;
  /** Starts workers that call `onJob` at the start of each handler. Resolves once they are running. */
  startWorkers(settings: WorkerSettings, onJob: OnJob): Promise<void>;
  /** Jobs not finished yet (waiting, active, or completed but not yet recorded). */
  unfinished(): Promise<number>;
  /** Jobs that ended in failure (should stay 0: the handlers are no-ops). */
  failed(): Promise<number>;
  /** Stops workers and closes connections. */
  stopWorkers(): Promise<void>;
  /** Removes everything setup() created. Safe to call after a failure. */
  teardown(): Promise<void>;
  /** How the system was configured, for the report. */
  describe(settings: WorkerSettings): string;
}

/** What every adapter factory gets. */
export interface AdapterContext {
  /** postgres://... of the server; adapters make their own database on it. */
  serverUrl: string;
  redisUrl: string;
  /** Unique per run and workload: used in database names and Redis prefixes. */
  tag: string;
}
