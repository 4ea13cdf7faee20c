import { stopController } from '../stop-controller.ts';
import { SafeEmitter } from '../observe/safe-emitter.ts';
import { toMilliseconds, type Duration } from '../duration.ts';
import type { JobQueries } from '../jobs/queries.ts';
import type { Driver } from '../storage/driver.ts';
import { abortableDriver } from '../storage/abortable-driver.ts';
import { endOrCut, graceLeft, STOP_GRACE_MS, within } from '../time-limit.ts';
import { MailroomError } from '../errors.ts';
import { Completer } from './completer.ts';
import { execute, type ExecutionDeps, type Outcome } from './execute.ts';
import type { HandlerTransaction } from './handler-tx.ts';
import { recordOutcome, type RecordDeps } from './record.ts';
import type { StepQueries } from '../jobs/step-queries.ts';
import type { Maintenance } from './maintenance.ts';
import type { ClaimedRow, JobHandler } from './types.ts';
import type { ControlQueries } from '../jobs/control-queries.ts';
import { QueueControls } from './queue-controls.ts';
import { HeldJobs } from './held-jobs.ts';
import { Chains, claimOf, EXTEND_AT, FOLLOWERS_PER_HEAD } from './chains.ts';
import { JobRun } from './job-run.ts';
import { SerialLane } from './serial-lane.ts';
import { Waker } from './waker.ts';
import { Signal } from './signal.ts';
import { WakeGate, wakeGateQueries } from '../storage/wake-gate.ts';
import { resolveWorkerOptions, type WorkerOptions } from './options.ts';
import { emitRecorded, refOf, type WorkerEvents } from './worker-events.ts';

export type { WorkerOptions } from './options.ts';
export type { WorkerEvents } from './worker-events.ts';

/** Room a worker reserved for a broker ingest's hand-off (see Worker.reserveHandOff). */
export interface HandOffRoom {
  /** Jobs the ingest may insert as claimed by the worker. */
  jobs: number;
  /** The lease to give them. */
  leaseMs: number;
  /** The worker to claim them for. */
  workerId: string;
}

const MAX_ERROR_BACKOFF_MS = 5_000;

/**
 * Claims jobs in batches with `FOR UPDATE SKIP LOCKED`, runs their handlers,
 * keeps their leases alive with heartbeats, and records each outcome fenced by
 * the job's claim token. Made by `mailroom.worker()`.
 */
export class Worker extends SafeEmitter<WorkerEvents> {
  readonly id: string;
  private readonly queues: string[];
  private readonly concurrency: number;
  private readonly prefetch: number;
  /** Claimed jobs waiting for a free slot (prefetch); leased and heartbeated. */
  private readonly buffer = new HeldJobs();
  /** Claimed followers of ordering keys, each waiting for the job before it to complete; leased and heartbeated. */
  private readonly chains = new Chains();
  private readonly leaseMs: number;
  private readonly pollMs: number;
  /** Jobs whose handler runs now; they count against concurrency. */
  private readonly running = new Map<string, JobRun>();
  /** Jobs whose handler finished and whose outcome is being written; still heartbeated. */
  private readonly finishing = new Map<string, JobRun>();
  private readonly completer: Completer;
  /** Completions, heartbeats and releases of this worker's jobs, one at a time (see SerialLane). */
  private readonly lane = new SerialLane();
  private heartbeating = false;
  private state: 'idle' | 'running' | 'stopping' | 'stopped' = 'idle';
  private loop: Promise<void> | undefined;
  private stopping: Promise<void> | undefined;
  /** Cuts the claim loop's sleep short (NOTIFY, a finished job, a stop). */
  private readonly waker = new Waker();
  private nextQueue = 0;
  /** The last claim came back short: a finished handler alone is no reason to claim again (see finished). */
  private starved = false;
  /** A claim is in flight: the room it asked for is spoken for until it comes back, so none is handed off meanwhile. */
  private claiming = false;
  /** Room promised to a broker ingest's hand-off (reserveHandOff) and not yet filled by adopt. */
  private handOffReserved = 0;
  /** A hand-off's batch stored jobs that may start and were not handed, since the last claim began: claim those first. */
  private waitingStored = false;
  private readonly controls: QueueControls;
  private readonly recordDeps: RecordDeps;
  private readonly executionDeps: ExecutionDeps;
  private readonly rateLimit: { max: number; perMs: number } | null;
  private readonly globalConcurrency: number | null;
  private readonly setsLimits: boolean;
  private abandoned = false;
  /** Aborted when a stop's writes (releases, outcomes, a claim) are still waiting a second past its timeout: they are cancelled. */
  private readonly halt = stopController();
  /** The driver for claims, heartbeats, releases and outcomes: {@link halt} cancels what they run. */
  private readonly db: Driver;
  private heartbeatTimer: NodeJS.Timeout | undefined;
  private unlisten: (() => Promise<void>) | undefined;
  /**
   * Fired when the jobs this worker holds or its room for more may have changed: a job finished or
   * its outcome was written, a claim came back, a hand-off was adopted, a stop (see handOffRoom,
   * waitForRunning).
   */
  private readonly changes = new Signal();
  /** Asks enqueuers for a NOTIFY while this worker sleeps, and not while jobs keep coming (see WakeGate). */
  private readonly gate: WakeGate;

  constructor(
    private readonly driver: Driver,
    private readonly queries: JobQueries,
    private readonly stepQueries: StepQueries,
    controlQueries: ControlQueries,
    private readonly quotedSchema: string,
    private readonly channel: string,
    private readonly options: WorkerOptions,
    private readonly maintenance: Maintenance | undefined,
  ) {
    super();
    this.db = abortableDriver(driver, this.halt.signal);
    const resolved = resolveWorkerOptions(options);
    this.queues = resolved.queues;
    this.concurrency = resolved.concurrency;
    this.prefetch = resolved.prefetch;
    this.leaseMs = resolved.leaseMs;
    this.pollMs = resolved.pollMs;
    this.id = resolved.id;
    this.rateLimit = resolved.rateLimit;
    this.globalConcurrency = resolved.globalConcurrency;
    this.setsLimits = resolved.setsLimits;
    this.controls = new QueueControls(this.db, queries, controlQueries, this.queues);
    this.gate = new WakeGate(driver, wakeGateQueries(quotedSchema), this.queues.map((q) => `queue:${q}`), this.id, this.pollMs, (error) => this.report(error));
    this.completer = new Completer(this.db, queries, {
      report: (error) => this.report(error),
      givingUp: () => this.state === 'stopped' || this.halt.signal.aborted,
      serialize: (write) => this.lane.run(write),
    });
    this.executionDeps = { driver: this.db, jobQueries: queries, stepQueries, leaseMs: this.leaseMs, workerId: this.id, quotedSchema };
    this.recordDeps = {
      driver: this.db,
      queries,
      completer: this.completer,
      withRetries: (write) => this.withRetries(write),
      report: (error) => this.report(error),
    };
  }

  /** Jobs this worker is running now. */
  get activeCount(): number {
    return this.running.size;
  }

  /**
   * Starts claiming and running jobs. Resolves once the worker is listening.
   *
   * @example
   * const worker = mailroom.worker({ queues: ['email'], handlers: { [sendWelcome.name]: send } });
   * await worker.start();
   */
  async start(): Promise<void> {
    if (this.state !== 'idle') throw new Error(`worker ${this.id} was already started`);
    this.state = 'running';
    if (this.setsLimits) await this.controls.configure(this.rateLimit, this.globalConcurrency);
    try {
      this.unlisten = await this.driver.listen(this.channel, (queue) => {
        if (!this.queues.includes(queue)) return;
        this.gate.notified();
        this.poke();
      });
    } catch (error) {
      this.report(error); // NOTIFY is only a hint: polling still finds the jobs.
    }
    this.heartbeatTimer = setInterval(() => void this.heartbeat(), Math.max(50, Math.floor(this.leaseMs / 3)));
    this.heartbeatTimer.unref();
    this.maintenance?.start();
    this.loop = this.claimLoop();
  }

  /**
   * Stops claiming, waits up to `timeout` (default `'30s'`) for running
   * handlers, then aborts the rest and hands their jobs back to the queue
   * without spending an attempt. The last worker of a `mailroom` also waits
   * for a maintenance pass in flight, for what is left of `timeout` (at least
   * a second); then that pass's statement is cancelled and reported as an error.
   * The stop's own writes (a claim, outcomes, releases) still waiting for a lock a
   * second past `timeout` are cancelled too: their jobs wait for their leases to run out.
   *
   * @example
   * process.on('SIGTERM', () => worker.stop({ timeout: '10s' }));
   */
  async stop(options: { timeout?: Duration } = {}): Promise<void> {
    // Checked before anything changes: a bad timeout leaves the worker running, not half stopped.
    const timeoutMs = toMilliseconds(options.timeout ?? '30s', 'stop timeout');
    if (this.state === 'stopped' || this.state === 'idle') {
      this.state = 'stopped';
      return;
    }
    if (this.state === 'stopping') return this.stopping;
    this.state = 'stopping';
    this.changes.fire();
    this.stopping = this.shutDown(timeoutMs);
    return this.stopping;
  }

  private async shutDown(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    this.gate.interrupt(); // an idle look waiting for a lock must not hold the loop
    this.poke();
    const handedBack = this.handBack(timeoutMs);
    // The writes get the timeout, and at least a second after the handlers were given up on; then they are cancelled.
    await endOrCut(handedBack, timeoutMs + STOP_GRACE_MS, {
      halt: this.halt,
      reason: new MailroomError(`worker ${this.id} stopped: stop()'s writes were cut short`),
      onCut: () => this.report(this.cutShort(timeoutMs)),
    });
    // A maintenance pass in flight gets what is left of the timeout (at least a second), then its statement is cancelled.
    await this.shutdownTimers(deadline - Date.now());
    await this.gate.close(graceLeft(deadline)).catch((error: unknown) => this.report(error));
    await within(this.unlisten?.().catch(() => {}) ?? Promise.resolve(), STOP_GRACE_MS, undefined);
    this.state = 'stopped';
  }

  /**
   * Stops claiming, gives running handlers `timeoutMs`, aborts the rest and
   * hands their jobs back; resolves once every job's outcome or release is written.
   */
  private async handBack(timeoutMs: number): Promise<void> {
    await this.loop;
    await this.releaseBuffered();
    await this.waitForRunning(timeoutMs);
    const unfinished = [...this.running.values()].filter((r) => !r.settled);
    for (const r of unfinished) {
      r.settled = true;
      r.abort(new Error('worker stopping: graceful stop timed out'));
    }
    await this.release(unfinished.map((r) => r.row));
    await this.completer.drain();
    await this.waitForRunning(Number.POSITIVE_INFINITY);
  }

  /** Says that a stop's writes were cut short, and what becomes of their jobs. */
  private cutShort(timeoutMs: number): MailroomError {
    return new MailroomError(
      `worker ${this.id}: stop() gave up on its writes (a claim, a job's outcome or its release) a second after its timeout of ${timeoutMs} ms; ` +
        `one was waiting for a lock (a LOCK TABLE or a transaction left open on mailroom's jobs, say) or, at its COMMIT, for a synchronous standby. ` +
        `They were cancelled: a write cancelled before its COMMIT was rolled back, and the jobs whose outcome or release was not written keep their claim ` +
        `until their lease runs out (within ${this.leaseMs} ms), then the maintenance loop rescues them and they run again; ` +
        'a COMMIT cancelled while it waited for a standby is committed on this server (PostgreSQL warns that the standby may not have it)',
    );
  }

  /**
   * Stops as a crashed process would: no completions, no releases, no more
   * heartbeats. Leases run out and the maintenance loop rescues the jobs.
   * Internal: the demo uses it to crash workers that share its process.
   */
  abandon(): void {
    this.abandoned = true;
    this.state = 'stopped';
    this.completer.abandon();
    void this.shutdownTimers();
    for (const r of this.running.values()) {
      r.settled = true;
      r.abort(new Error('worker abandoned'));
    }
    this.running.clear();
    this.finishing.clear();
    this.buffer.takeAll();
    this.changes.fire();
    this.chains.takeAll();
    this.poke();
    void this.unlisten?.().catch(() => {});
  }

  /**
   * Stops the heartbeats and this worker's share of the maintenance loop; resolves once a
   * maintenance pass in flight has ended (its statement cancelled after `passLimitMs`).
   */
  private async shutdownTimers(passLimitMs = Number.POSITIVE_INFINITY): Promise<void> {
    if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
    this.heartbeatTimer = undefined;
    await this.maintenance?.stop(passLimitMs);
  }

  private poke(): void {
    this.waker.poke();
  }

  private sleep(ms: number): Promise<void> {
    return this.waker.sleep(ms);
  }

  private async claimLoop(): Promise<void> {
    let errorDelay = 0;
    while (this.state === 'running') {
      this.startBuffered();
      // Followers are held apart: they never take a slot from a head (another key) that could run now.
      const free = this.freeRoom();
      // Jobs whose outcome is still being written hold their claims too. Up to two more full sets of them
      // is normal (a completion batch in flight and the next one filling); past that, completions are
      // falling behind: stop claiming until they catch up, so at most 3 x (concurrency + prefetch) jobs
      // are ever claimed at once. (A tighter bound cost 17 % of the drain rate at prefetch 1000.)
      const behind = this.completionsBehind();
      if (free <= 0 || behind || this.buffer.size > this.prefetch / 2) {
        await this.sleep(this.pollMs);
        continue;
      }
      let rows: ClaimedRow[] | undefined;
      this.waitingStored = false;
      this.claiming = true;
      try {
        rows = await this.claim(free);
        this.starved = rows.filter((r) => !r.blocked).length < free;
      } catch (error) {
        this.report(error);
      } finally {
        this.claiming = false;
        this.changes.fire();
      }
      if (rows === undefined) {
        errorDelay = Math.min(MAX_ERROR_BACKOFF_MS, Math.max(100, errorDelay * 2));
        await this.sleep(errorDelay);
        continue;
      }
      errorDelay = 0;
      if (this.abandoned) break; // A crash: the claimed jobs wait for their leases to expire.
      if (this.state !== 'running') {
        // Stopped while claiming: hand the jobs straight back.
        await this.release(rows);
        break;
      }
      if (rows.length > 0) this.gate.worked();
      const { run, orphans } = this.chains.split(rows);
      if (orphans.length > 0) void this.release(orphans);
      this.buffer.push(run);
      this.startBuffered();
      // Starved: enqueuers notify only once this worker says it sleeps (a short look again first, see WakeGate).
      if (this.starved) await this.sleep(await this.gate.idle());
      else await new Promise<void>((resolve) => setImmediate(resolve));
    }
  }

  /** Slots and prefetch not taken by running, held or promised jobs (followers are held apart). */
  private freeRoom(): number {
    return this.concurrency + this.prefetch - this.running.size - this.buffer.size - this.handOffReserved;
  }

  private completionsBehind(): boolean {
    return this.finishing.size >= 2 * (this.concurrency + this.prefetch);
  }

  /**
   * Room for jobs that a broker ingest inserts already claimed by this worker
   * (their lease, this worker's id, attempt 1), so that they run without a
   * claim of their own: up to `max` of the free slots and prefetch, reserved
   * until {@link adopt}. None unless this worker is running, its last claim
   * found nothing left to take in the queue (so a waiting job is never
   * overtaken), and the queue has no shared limits (those count every start
   * in their own claim).
   *
   * @example
   * const room = worker.reserveHandOff('mailroom.group.billing', batch.length);
   * // insert up to room?.jobs rows as claimed, commit, then:
   * worker.adopt(handedRows, room?.jobs ?? 0, storedNotHanded);
   */
  reserveHandOff(queue: string, max: number): HandOffRoom | null {
    const jobs = Math.min(max, this.handOffRoom(queue) ?? 0);
    if (jobs <= 0) return null;
    this.handOffReserved += jobs;
    return { jobs, leaseMs: this.leaseMs, workerId: this.id };
  }

  /**
   * How many jobs a hand-off to `queue` could take now (see
   * {@link reserveHandOff}): 0 while this worker is busy (no free slot or
   * prefetch room, its last claim found more waiting, or its completions are
   * behind, or a claim is in flight), null when it takes none whatever frees (not running, or the
   * queue is not its own or has shared limits). {@link roomChanged} says when
   * to look again.
   *
   * @example
   * while (worker.handOffRoom(queue) === 0) await worker.roomChanged(1000);
   */
  handOffRoom(queue: string): number | null {
    if (this.state !== 'running' || !this.queues.includes(queue) || this.controls.limits(queue)) return null;
    if (!this.starved || this.claiming || this.waitingStored || this.completionsBehind()) return 0;
    return Math.max(0, this.freeRoom());
  }

  /** The most jobs this worker holds at once: its slots and its prefetch. */
  get capacity(): number {
    return this.concurrency + this.prefetch;
  }

  /** Resolves when {@link handOffRoom} may have changed (a job finished or was written, a claim came back, a stop), or after `ms`. */
  roomChanged(ms: number): Promise<void> {
    return this.changes.wait(ms);
  }

  /**
   * Takes the jobs a hand-off committed as claimed by this worker (see
   * {@link reserveHandOff}) and gives back the room reserved for it. A worker
   * that is stopping hands them back to the queue; an abandoned one leaves
   * them to lease expiry, as a crash would. `waiting`: jobs the same batch
   * stored that may start and were not handed (no room); the worker claims
   * those before it takes another hand-off, so they are not overtaken.
   */
  adopt(rows: readonly ClaimedRow[], reserved: number, waiting: number): void {
    this.handOffReserved = Math.max(0, this.handOffReserved - reserved);
    this.changes.fire();
    if (waiting > 0) {
      this.waitingStored = true;
      this.starved = false;
      this.poke();
    }
    if (this.abandoned || rows.length === 0) return;
    if (this.state !== 'running') {
      void this.release([...rows]);
      return;
    }
    this.gate.worked();
    this.buffer.push(rows);
    this.startBuffered();
  }

  /** Starts buffered jobs while there are free slots. */
  private startBuffered(): void {
    while (this.buffer.size > 0 && this.running.size < this.concurrency && this.state === 'running') this.run(this.buffer.take()!);
  }

  /** Hands the buffered jobs and followers back to the queue, attempt not spent (graceful stop). */
  private releaseBuffered(): Promise<void> {
    return this.release([...this.buffer.takeAll(), ...this.chains.takeAll()]);
  }

  /**
   * A job's outcome is settled: if it was completed (committed), the follower
   * behind it may start; otherwise the followers behind it are handed back.
   * Returns true when a follower was started.
   */
  private afterJob(row: ClaimedRow, completed: boolean): boolean {
    if (!this.chains.active || this.abandoned) return false;
    if (completed && this.state === 'running') {
      const next = this.chains.next(row);
      if (next === undefined) return false;
      this.buffer.push([next.row]);
      this.startBuffered();
      // Running low: the next claim takes more followers behind this chain's last one.
      if (next.left === EXTEND_AT) this.poke();
      return true;
    }
    const rest = this.chains.drop(row);
    if (rest.length > 0) void this.release(rest);
    return false;
  }

  /**
   * Claims up to `limit` jobs that may start, one statement per queue, starting from a rotating queue
   * for fairness; followers of ordering keys come on top, within their own room (see Chains).
   */
  private async claim(limit: number): Promise<ClaimedRow[]> {
    const claimed: ClaimedRow[] = [];
    const anchors = this.chains.anchors();
    // At most max(concurrency, prefetch) followers held: with prefetch 0, a chain per running key.
    let room = Math.max(0, Math.max(this.concurrency, this.prefetch) - this.chains.size);
    let heads = 0;
    const start = this.nextQueue++ % this.queues.length;
    for (let i = 0; i < this.queues.length && heads < limit; i++) {
      const queue = this.queues[(start + i) % this.queues.length]!;
      const rows = await this.controls.claim(queue, limit - heads, this.leaseMs, this.id, { perHead: FOLLOWERS_PER_HEAD, anchors, room });
      for (const row of rows) {
        if (row.blocked) room--;
        else heads++;
        claimed.push(row);
      }
    }
    return claimed;
  }

  private run(row: ClaimedRow): void {
    const entry = new JobRun(row);
    this.running.set(row.id, entry);
    if (this.listenerCount('started') > 0) this.emit('started', refOf(row));
    void execute(entry, this.options.handlers[row.type] as JobHandler | undefined, this.executionDeps).then(({ outcome, tx }) => {
      try {
        if (outcome.kind === 'rate-limited' && !entry.settled) {
          // Back the queue off before this slot can claim again.
          this.withRetries(() => this.controls.pause(row.queue, outcome.delayMs)).then(
            () => this.finished(entry, outcome, tx),
            (error: unknown) => {
              this.report(error);
              this.finished(entry, outcome, tx);
            },
          );
        } else {
          this.finished(entry, outcome, tx);
        }
      } catch (error) {
        this.report(error); // a bug here must not become an unhandled rejection that ends the process
      }
    });
  }

  /** The handler is done: its slot is free at once, and its outcome is written in the background. */
  private finished(entry: JobRun, outcome: Outcome, tx: HandlerTransaction | undefined): void {
    const { row } = entry;
    entry.finish();
    if (this.running.get(row.id) === entry) this.running.delete(row.id);
    this.finishing.set(row.id, entry);
    this.startBuffered();
    this.changes.fire();
    // A free slot is a reason to claim unless the last claim found too little; then new work announces
    // itself (NOTIFY, a completion that may have let a key go, the poll).
    if (this.state === 'running' && !this.starved) this.poke();
    const settle = (): void => {
      if (this.finishing.get(row.id) === entry) this.finishing.delete(row.id);
      this.changes.fire();
    };
    if (outcome.kind === 'completed' && tx === undefined && !entry.settled) {
      // The hot path: a batched, fenced completion.
      entry.settled = true;
      this.completer.complete(row.id, row.claim_count, entry.inboxKey).then(
        (recorded) => {
          if (!this.abandoned) {
            if (recorded) {
              if (this.listenerCount('completed') > 0) {
                this.emit('completed', { id: row.id, type: row.type, queue: row.queue, attempt: row.attempt, correlationId: row.correlation_id, durationMs: entry.durationMs });
              }
            }
            else this.emit('stale', refOf(row));
          }
          settle();
          // A committed completion may have freed room under a queue's shared limits: look again, unless
          // this worker holds the key's next job (a follower) and just started it. A worker whose last
          // claim found too little has nothing else to look for: new work announces itself (NOTIFY, the
          // poll), and so does the next job of an ordering key that the completion unblocked (the release
          // trigger's NOTIFY), so a keyed job is no reason to claim again either.
          const mayFree = this.controls.limits(row.queue) || !this.starved;
          if (!this.afterJob(row, recorded) && this.state === 'running' && mayFree) this.poke();
        },
        (error: unknown) => {
          this.report(error);
          settle();
          this.afterJob(row, false);
        },
      );
      return;
    }
    this.record(entry, outcome, tx).then(
      (completed) => {
        settle();
        this.afterJob(row, completed);
      },
      (error: unknown) => {
        this.report(error);
        settle();
        this.afterJob(row, false);
      },
    );
  }

  /** Writes a job's outcome (other than the batched completion); resolves to true if it was recorded as completed. */
  private async record(entry: JobRun, outcome: Outcome, tx: HandlerTransaction | undefined): Promise<boolean> {
    if (entry.settled || outcome.kind === 'abandoned') {
      await tx?.rollback();
      return false;
    }
    entry.settled = true;
    const { row } = entry;
    const result = await recordOutcome(this.recordDeps, row, outcome, tx, entry.inboxKey);
    if (this.abandoned) return false;
    emitRecorded(this, row, result, entry.durationMs);
    return result.kind === 'completed';
  }

  /** Hands claimed jobs back in one statement (graceful stop); a job no longer ours is left alone. */
  private async release(rows: ClaimedRow[]): Promise<void> {
    if (this.abandoned || rows.length === 0) return;
    try {
      const { rows: released } = await this.lane.run(() =>
        this.db.run<{ id: string; type: string }>(this.queries.releaseMany, [rows.map((r) => r.id), rows.map((r) => r.claim_count)]),
      );
      for (const job of released) this.emit('released', job);
    } catch (error) {
      this.report(error); // The lease will expire and the job will be rescued.
    }
  }

  /** Retries a write a few times (the database may be restarting); then leaves the job to lease expiry. */
  private async withRetries<T>(write: () => Promise<T>): Promise<T> {
    let delay = 100;
    for (let attempt = 1; ; attempt++) {
      try {
        return await write();
      } catch (error) {
        if (attempt >= 6 || this.state === 'stopped' || this.halt.signal.aborted) throw error;
        this.report(error);
        await new Promise((r) => setTimeout(r, delay));
        delay = Math.min(delay * 2, 5000);
      }
    }
  }

  private async heartbeat(): Promise<void> {
    if (this.heartbeating) return; // the previous one is still queued or running
    this.heartbeating = true;
    try {
      await this.lane.run(() => this.renewLeases());
    } catch (error) {
      this.report(error);
    } finally {
      this.heartbeating = false;
    }
  }

  /** Extends the lease of every job this worker holds; stops the ones whose lease was lost. */
  private async renewLeases(): Promise<void> {
    const entries = [...this.running.values(), ...this.finishing.values()];
    const held = this.buffer.toArray();
    const followers = this.chains.toArray();
    const leased = [...entries.map((e) => e.row), ...held, ...followers];
    if (leased.length === 0) return;
    const { rows } = await this.db.run<{ id: string; claim_count: number }>(this.queries.heartbeat, [leased.map((r) => r.id), leased.map((r) => r.claim_count), this.leaseMs]);
    // By claim, not only by id: a job rescued and claimed again by this worker is held twice, once stale.
    const kept = new Set(rows.map((r) => claimOf(r)));
    // A held (prefetched) job whose lease was lost (rescued) is dropped before it starts.
    const lost = new Set(held.filter((row) => !kept.has(claimOf(row))));
    for (const row of this.buffer.remove(lost)) {
      this.emit('stale', refOf(row));
      // It will never complete here: the followers behind it (if it was one, that had started) go back.
      const behind = this.chains.drop(row);
      if (behind.length > 0) void this.release(behind);
    }
    // A lost follower is dropped with the rest of its chain, which must not run before it.
    const lostFollowers = new Set(followers.filter((row) => !kept.has(claimOf(row))).map((row) => row.id));
    const { lost: dropped, rest } = this.chains.removeLost(lostFollowers);
    for (const row of dropped) this.emit('stale', refOf(row));
    if (rest.length > 0) void this.release(rest);
    for (const e of entries) {
      if (!kept.has(claimOf(e.row)) && !e.settled && (this.running.get(e.row.id) === e || this.finishing.get(e.row.id) === e)) {
        // Lease lost (rescued, maybe running elsewhere): stop the handler; its result would be refused anyway.
        e.settled = true;
        e.abort(new Error('lease lost: the job was rescued after its lease expired'));
        this.emit('stale', refOf(e.row));
      }
    }
  }

  /** Resolves once no job runs or has its outcome being written, or after `timeoutMs`. */
  private async waitForRunning(timeoutMs: number): Promise<void> {
    const until = Date.now() + timeoutMs;
    while (this.running.size > 0 || this.finishing.size > 0) {
      const left = until - Date.now();
      if (left <= 0) return;
      await this.changes.wait(left);
    }
  }

  private report(error: unknown): void {
    if (this.halt.signal.aborted && error === this.halt.signal.reason) return; // what a stop cut short: it said so, once
    if (this.listenerCount('error') > 0) this.emit('error', error);
    else console.error(`[mailroom] worker ${this.id}:`, error instanceof Error ? error.message : error);
  }
}
