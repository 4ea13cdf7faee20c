import { stopController } from '../stop-controller.ts';
import { SafeEmitter } from '../observe/safe-emitter.ts';
import type { SafetyWarning } from '../brokers/safety.ts';
import { MailroomError } from '../errors.ts';
import { toMilliseconds, type Duration } from '../duration.ts';
import type { OutboxQueries } from '../events/outbox-queries.ts';
import type { Driver } from '../storage/driver.ts';
import { PeriodicPass, RUN_TO_END, type PassControl } from '../storage/periodic-pass.ts';
import { abortableDriver } from '../storage/abortable-driver.ts';
import { endOrCut, graceLeft, STOP_GRACE_MS, unlessAborted, within } from '../time-limit.ts';
import { inBatches } from '../storage/batches.ts';
import { afterRound, stalled } from './after-round.ts';
import type { ResolvedRelayOptions } from './options.ts';
import { dropReadAhead, readAheadRound } from './read-ahead-round.ts';
import type { RelayEvents, RelayFlushResult } from './relay-events.ts';
import type { RelayQueries } from './relay-queries.ts';
import type { Round, RoundHost, TargetState } from './round-state.ts';
import { ParkedEvents } from './parking.ts';
import { transactionalRound } from './transactional-round.ts';
import { Waker } from '../worker/waker.ts';
import { WakeGate, type WakeGateQueries } from '../storage/wake-gate.ts';
import { ReadSize } from './read-size.ts';

export type { RelayEvents, RelayFlushResult } from './relay-events.ts';

const HELD_BACK_RECHECK_MS = 50;
/**
 * The longest wait between two looks while held back, whatever `pollInterval`: the end of the holding
 * transaction sends no NOTIFY, and any long transaction on the server (another application's) holds
 * the fence, so a relay relying on NOTIFY with a long poll would otherwise deliver long after it ended.
 */
const HELD_BACK_MAX_MS = 1_000;
const PRUNE_BATCH = 1000;
const MAX_PRUNE_BATCHES = 100;
const MAX_ERROR_BACKOFF_MS = 5_000;
/** How often a running relay checks whether mailroom's tables need `ANALYZE` (src/storage/statistics.ts). */
const STATISTICS_INTERVAL_MS = 5_000;

/**
 * How late, with a relay running, an event whose broker confirm was lost can
 * be published again: after a crash between the confirm and the cursor's
 * commit another relay takes over once the lease ran out; a failed publish is
 * retried within the longest error backoff.
 *
 * @example
 * republishHorizonMs(30_000) // 35000
 */
export function republishHorizonMs(leaseMs: number): number {
  return leaseMs + MAX_ERROR_BACKOFF_MS;
}

/**
 * Reads the outbox in commit-safe order and delivers it to its targets: the
 * internal fan-out into consumer groups' jobs, and any broker targets. Each
 * target has a cursor and a fenced lease, so several relays can run and one
 * delivers each target at a time. Made by `mailroom.relay()`.
 */
export class Relay extends SafeEmitter<RelayEvents> {
  readonly id: string;
  private readonly states: TargetState[];
  private state: 'idle' | 'running' | 'stopping' | 'stopped' = 'idle';
  /** The stop in progress or done, which a second `stop()` waits for. */
  private stopping: Promise<void> | undefined;
  private loops: Promise<void>[] = [];
  private timers: NodeJS.Timeout[] = [];
  /** The statistics refresh and the outbox prune in the background, while the relay runs. */
  private readonly refreshing: PeriodicPass;
  private readonly pruning: PeriodicPass;
  private unlisten: (() => Promise<void>) | undefined;
  /** Asks publishers for a NOTIFY while this relay sleeps, and not while events keep coming (see WakeGate). */
  private readonly gate: WakeGate;
  /** Which outbox this is (`RelayContext.origin`), read once; undefined when the database does not say. */
  private originRead: Promise<string | undefined> | undefined;
  /** Aborted when a stop's timeout is spent with rounds still in flight: their statements are cancelled and they are waited for no more. */
  private readonly halt = stopController();
  /** The driver the rounds use: {@link halt} cancels what they run. */
  private readonly db: Driver;
  /** What the rounds need from this relay. */
  private readonly host: RoundHost;

  /** @internal use `mailroom.relay()` */
  constructor(
    private readonly driver: Driver,
    private readonly queries: RelayQueries,
    private readonly outbox: OutboxQueries,
    wakeQueries: WakeGateQueries,
    private readonly channel: string,
    private readonly options: ResolvedRelayOptions,
    /** The mailroom's `maxPayloadBytes`, for the targets' size checks. */
    private readonly maxPayloadBytes?: number,
    /** Analyzes mailroom's tables whose statistics fell behind (src/storage/statistics.ts), for a process that runs no worker. */
    private readonly refreshStatistics: (signal?: AbortSignal) => Promise<unknown> = async () => [],
  ) {
    super();
    this.id = options.id;
    this.db = abortableDriver(driver, this.halt.signal);
    const report = (error: unknown) => this.report(error);
    this.host = {
      id: this.id,
      db: this.db,
      queries,
      options,
      halt: this.halt.signal,
      origin: () => this.origin(),
      // EventEmitter's typed emit cannot be called with a generic event name; RoundHost.tell keeps the pairing typed.
      tell: (event, ...info) => (this.emit as (name: string, ...args: unknown[]) => boolean).call(this, event, ...info),
      report,
    };
    this.gate = new WakeGate(driver, wakeQueries, ['outbox'], this.id, options.pollMs, report);
    // Only a relay holding a lease prunes; each pass ends after its current batch once the relay stops.
    const pruneEvery = Math.min(60_000, Math.max(1000, Math.floor(options.retentionMs / 10)));
    this.pruning = new PeriodicPass('outbox prune', pruneEvery, (pass) => (this.states.every((s) => s.token === null) ? Promise.resolve() : this.pruneOutbox(pass)), report);
    this.refreshing = new PeriodicPass('statistics', STATISTICS_INTERVAL_MS, (pass) => this.refreshStatistics(pass.signal), report);
    this.states = options.targets.map((target) => ({
      target,
      token: null,
      busy: Promise.resolve(),
      waker: new Waker(),
      heldBackSince: null,
      lastHeldBackReport: 0,
      ahead: null,
      known: null,
      emptyAgain: 0,
      parked: new ParkedEvents(this.db, queries, target.name),
      readSize: ReadSize.of(this.options.batchSize),
    }));
  }

  /** The names of this relay's targets. */
  get targets(): string[] {
    return this.states.map((s) => s.target.name);
  }

  /**
   * Starts relaying: takes each target's lease when it is free, delivers,
   * renews, and wakes on NOTIFY (polling as the safety net). Resolves once
   * each target's `start()` is done (a NATS target's stream exists then).
   *
   * @example
   * const relay = mailroom.relay({ batchSize: 200 });
   * await relay.start();
   */
  async start(): Promise<void> {
    if (this.state !== 'idle') throw new MailroomError(`relay ${this.id} was already started`);
    this.state = 'running';
    try {
      this.unlisten = await this.driver.listen(this.channel, () => {
        this.gate.notified();
        for (const s of this.states) this.poke(s);
      });
    } catch (error) {
      this.report(error); // NOTIFY is only a hint
    }
    await this.startTargets();
    if (this.state !== 'running') return; // stopped meanwhile
    const renew = setInterval(() => void this.renewAll(), Math.max(50, Math.floor(this.options.leaseMs / 3)));
    renew.unref();
    this.timers = [renew];
    this.pruning.start();
    this.refreshing.start();
    this.refreshing.runNow();
    this.loops = this.states.map((s) => this.loop(s));
    void this.check().then(
      (warnings) => {
        for (const w of warnings) {
          if (this.listenerCount('warning') > 0) this.emit('warning', w);
          else console.warn(`[mailroom] relay ${this.id}: ${w.subject}: ${w.message} (${w.code})`);
        }
      },
      (error: unknown) => this.report(error),
    );
  }

  /** Each target's `start()` (a NATS target declares its stream), awaited; a failure is reported and its first publish tries again. */
  private async startTargets(): Promise<void> {
    const context = { republishHorizonMs: republishHorizonMs(this.options.leaseMs), maxPayloadBytes: this.maxPayloadBytes };
    await Promise.all(this.states.map((s) => Promise.resolve().then(() => s.target.start?.(context)).catch((error: unknown) => this.report(error))));
  }

  /**
   * Asks each broker target about settings that break a guarantee (a
   * duplicate window shorter than a republish can come, a broker that keeps
   * nothing on disk, …). `start()` runs it and reports what it finds.
   *
   * @example
   * for (const w of await relay.check()) console.warn(w.code, w.message);
   */
  async check(): Promise<SafetyWarning[]> {
    const origin = (await this.origin()) ?? null;
    const context = { republishHorizonMs: republishHorizonMs(this.options.leaseMs), maxPayloadBytes: this.maxPayloadBytes, origin };
    const found = await Promise.all(this.states.map((s) => s.target.check?.(context) ?? Promise.resolve([])));
    return found.flat();
  }

  /**
   * Stops relaying: waits for rounds in flight, then hands the leases back so
   * another relay can take over at once. A background pass in flight (outbox
   * prune, statistics) ends after its current batch; one still running after
   * `timeout` (default `'30s'`, at least a second; blocked on a lock, say) has
   * its statement cancelled, and the relay reports that as an error. A round
   * still running then (a lock, a publish never answered) is cut short the
   * same way, reported, and its target's lease left to run out, as after a crash.
   *
   * @example
   * process.on('SIGTERM', () => relay.stop({ timeout: '10s' }));
   */
  async stop(options: { timeout?: Duration } = {}): Promise<void> {
    const limitMs = toMilliseconds(options.timeout ?? '30s', 'stop timeout');
    // A second stop (say `mailroom.close()` after a stop not awaited) resolves with the first, not before it.
    if (this.state === 'stopping' || this.state === 'stopped') return this.stopping;
    this.stopping = this.shutDown(limitMs);
    return this.stopping;
  }

  private async shutDown(limitMs: number): Promise<void> {
    const wasRunning = this.state === 'running';
    const deadline = Date.now() + limitMs;
    this.state = 'stopping';
    this.gate.interrupt(); // an idle look waiting for a lock must not hold a loop
    for (const t of this.timers) clearInterval(t);
    const passes = Promise.all([this.pruning.stop(limitMs), this.refreshing.stop(limitMs)]);
    for (const s of this.states) this.poke(s);
    const ended = this.states.map(() => false);
    const drained = Promise.all(this.loops).then(() =>
      Promise.all(
        this.states.map(async (s, i) => {
          await s.busy; // a flush() in flight
          await dropReadAhead(this.host, s);
          ended[i] = true;
        }),
      ),
    );
    // Rounds still in flight after the timeout (at least a second) are cut short: their statements cancelled, a publish left unanswered.
    const waitMs = Math.max(STOP_GRACE_MS, limitMs);
    let cut: TargetState[] = [];
    await endOrCut(drained, waitMs, {
      halt: this.halt,
      reason: new MailroomError(`relay ${this.id} stopped: rounds were still in flight ${waitMs} ms into stop()`),
      onCut: () => {
        cut = this.states.filter((_, i) => !ended[i]);
        if (cut.length > 0) this.report(this.cutShort(cut, waitMs));
      },
    });
    await passes;
    for (const s of this.states) {
      const token = s.token;
      s.token = null;
      // A round cut short may still have a publish out: its lease runs out instead, as after a crash.
      if (token === null || cut.includes(s)) continue;
      const releaseMs = graceLeft(deadline);
      const signal = AbortSignal.timeout(releaseMs);
      await this.driver.run(this.queries.release, [s.target.name, this.id, token], { signal }).catch((e: unknown) =>
        this.report(
          signal.aborted
            ? new MailroomError(
                `relay ${this.id}: handing back target ${s.target.name}'s lease did not end within ${releaseMs} ms (what was left of stop()'s timeout, at least a second; ` +
                  `a lock on its relay_cursors row, say). It was cancelled: the lease runs out within ${this.options.leaseMs} ms instead, and another relay takes the target over then`,
              )
            : e,
        ),
      );
    }
    for (const s of this.states) {
      const closing = Promise.resolve()
        .then(() => s.target.close?.())
        .catch((e: unknown) => this.report(e))
        .then(() => true);
      if (!(await within(closing, graceLeft(deadline), false))) {
        this.report(new MailroomError(`relay ${this.id}: target ${s.target.name}'s close() did not resolve within the stop's timeout; the relay stopped without waiting for it`));
      }
    }
    if (wasRunning) {
      await this.gate.close(graceLeft(deadline)).catch((e: unknown) => this.report(e));
      await within(this.unlisten?.().catch(() => {}) ?? Promise.resolve(), STOP_GRACE_MS, undefined);
    }
    this.state = 'stopped';
  }

  /** Says which targets' rounds a stop cut short, and what becomes of their events. */
  private cutShort(cut: readonly TargetState[], waitMs: number): MailroomError {
    const names = cut.map((s) => s.target.name).join(', ');
    return new MailroomError(
      `relay ${this.id}: the round in flight for target ${names} did not end within ${waitMs} ms of stop() (its timeout, at least a second; a statement waiting for a lock, a COMMIT waiting for a synchronous standby, or a publish not answered). ` +
        `Its statements were cancelled (a COMMIT that waited for a standby is committed on this server) and a publish still unanswered was left behind; the lease is left to run out (within ${this.options.leaseMs} ms) instead of being handed back, ` +
        'so that no other relay delivers beside it. Another relay then delivers again whatever the round had not recorded as delivered: nothing is lost, and consumers drop the copies by event id',
    );
  }

  /**
   * Delivers everything deliverable now, target by target, and resolves with
   * what it did. Takes a target's lease when free; a target leased by another
   * relay is left alone (`leased: false`). For scripts, tests and shutdown.
   *
   * @example
   * const { internal } = await relay.flush(); console.log(internal?.delivered);
   */
  async flush(): Promise<Record<string, RelayFlushResult>> {
    const result: Record<string, RelayFlushResult> = {};
    for (const s of this.states) {
      const entry: RelayFlushResult = { delivered: 0, heldBack: false, leased: true };
      result[s.target.name] = entry;
      if (s.token === null) s.token = await this.acquire(s);
      if (s.token === null) {
        entry.leased = false;
        continue;
      }
      s.emptyAgain = 0;
      for (;;) {
        const round = await this.serialized(s, () => this.round(s));
        if (round.kind === 'lost') {
          s.token = null;
          entry.leased = false;
          this.emit('lease-lost', { target: s.target.name });
          break;
        }
        entry.delivered += round.delivered;
        if (round.exhausted || round.blockedBy !== null) {
          const after = await afterRound(this.host, s, round);
          if (after === 'again') {
            if (!stalled(this.host, s, round)) {
              await yieldToTimers();
              continue;
            }
            entry.heldBack = true;
            break;
          }
          entry.heldBack = after === 'held-back';
          break;
        }
      }
    }
    return result;
  }

  /**
   * Deletes delivered events older than `retention`, in bounded batches: only
   * events every target's cursor has passed; and events parked longer than
   * `parkedRetention`. Runs on its own while the relay holds a lease.
   *
   * @example
   * const { events, parked } = await relay.prune();
   */
  async prune(): Promise<{ events: number; parked: number }> {
    return this.pruneOutbox(RUN_TO_END);
  }

  /** A prune pass that begins no more batches once `pass.stopped()` (the background pass, once the relay stops). */
  private async pruneOutbox(pass: PassControl): Promise<{ events: number; parked: number }> {
    const { signal } = pass;
    const stopped = () => pass.stopped();
    const events = await inBatches(PRUNE_BATCH, MAX_PRUNE_BATCHES, () => this.driver.run(this.outbox.prune, [this.options.retentionMs, PRUNE_BATCH], { signal }), stopped);
    if (!stopped()) await this.driver.run(this.outbox.pruneKeys, [PRUNE_BATCH], { signal });
    const parked = await inBatches(PRUNE_BATCH, MAX_PRUNE_BATCHES, () => this.driver.run(this.outbox.pruneParked, [this.options.parkedRetentionMs, PRUNE_BATCH], { signal }), stopped);
    if (events > 0 || parked > 0) this.emit('pruned', { events, parked });
    return { events, parked };
  }

  private async loop(s: TargetState): Promise<void> {
    let errorDelay = 0;
    let heldDelay = 0;
    while (this.state === 'running') {
      try {
        if (s.token === null) {
          s.token = await this.acquire(s);
          if (s.token === null) {
            await this.sleep(s, Math.min(this.options.pollMs, this.options.leaseMs / 2));
            continue;
          }
        }
        const round = await unlessAborted(this.serialized(s, () => this.round(s)), this.halt.signal);
        errorDelay = 0;
        if (round.kind === 'lost') {
          s.token = null;
          this.emit('lease-lost', { target: s.target.name });
          continue;
        }
        if (round.delivered > 0) this.gate.worked();
        if (!round.exhausted && round.blockedBy === null) continue; // more is waiting
        const after = await afterRound(this.host, s, round);
        if (after === 'again') {
          if (stalled(this.host, s, round)) await this.sleep(s, this.options.pollMs);
          continue;
        }
        s.emptyAgain = 0;
        // The end of the transaction that holds the fence sends no NOTIFY: look again soon, backing off to the
        // poll (at most HELD_BACK_MAX_MS) while rounds deliver nothing. A round that delivered starts the
        // back-off over: with publishers always in flight, every round ends held back, and the doubling would
        // otherwise reach the poll. Each step doubles the wait actually slept, which the gate cuts to a few ms
        // while the relay polls fast.
        const fresh = heldDelay === 0 || round.delivered > 0;
        heldDelay = after === 'held-back' ? this.gate.capped(Math.min(this.options.pollMs, HELD_BACK_MAX_MS, fresh ? HELD_BACK_RECHECK_MS : heldDelay * 2)) : 0;
        // Idle: publishers notify only once this relay says it sleeps (a short look again first, see WakeGate).
        await this.sleep(s, heldDelay || (await this.gate.idle()));
      } catch (error) {
        this.report(error);
        errorDelay = Math.min(MAX_ERROR_BACKOFF_MS, Math.max(100, errorDelay * 2));
        await this.sleep(s, errorDelay);
      }
    }
  }

  private serialized<T>(s: TargetState, fn: () => Promise<T>): Promise<T> {
    const run = s.busy.then(fn, fn);
    s.busy = run.catch(() => undefined);
    return run;
  }

  private async acquire(s: TargetState): Promise<string | null> {
    const { rows } = await this.db.run<{ token: string }>(this.queries.acquire, [s.target.name, this.id, this.options.leaseMs]);
    const token = rows[0]?.token ?? null;
    if (token === null) return null;
    // Without the list, a parked event met again is refused and parked again (kept as it was), then left out.
    await s.parked.load().catch((error: unknown) => this.report(error));
    this.emit('lease-acquired', { target: s.target.name, token });
    return token;
  }

  private async renewAll(): Promise<void> {
    for (const s of this.states) {
      const token = s.token;
      if (token === null) continue;
      try {
        const { rowCount } = await this.db.run(this.queries.renew, [s.target.name, this.id, token, this.options.leaseMs]);
        if (rowCount === 0 && s.token === token) {
          s.token = null;
          this.emit('lease-lost', { target: s.target.name });
        }
      } catch (error) {
        this.report(error);
      }
    }
  }

  /**
   * The outbox's name for targets (`RelayContext.origin`), read once; undefined
   * where the role may not call `pg_control_system()`. Any other failure (the
   * database unreachable, say) rejects and is asked again next time, so that
   * a moment's outage does not leave the targets without it for good.
   */
  private origin(): Promise<string | undefined> {
    this.originRead ??= this.db.run<{ origin: string }>(this.queries.origin, []).then(
      ({ rows }) => rows[0]?.origin,
      (error: unknown) => {
        if ((error as { code?: unknown } | null)?.code === '42501') return undefined; // insufficient_privilege
        this.originRead = undefined;
        throw error;
      },
    );
    return this.originRead;
  }

  /** One batch for one target (see transactional-round.ts and read-ahead-round.ts). */
  private round(s: TargetState): Promise<Round> {
    return s.target.readAhead === true ? readAheadRound(this.host, s) : transactionalRound(this.host, s);
  }

  private poke(s: TargetState): void {
    s.waker.poke();
  }

  private sleep(s: TargetState, ms: number): Promise<void> {
    return this.state === 'running' ? s.waker.sleep(ms) : Promise.resolve();
  }

  private report(error: unknown): void {
    if (this.halt.signal.aborted && error === this.halt.signal.reason) return; // what a stop cut short: it said so, once
    if (this.listenerCount('error') > 0) this.emit('error', error);
    else console.error(`[mailroom] relay ${this.id}:`, error instanceof Error ? error.message : error);
  }
}

/** Lets timers and I/O callbacks run between rounds (an in-process database such as PGlite answers without them). */
function yieldToTimers(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}
