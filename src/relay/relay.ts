import { stopController } from '../stop-controller.ts';
import { SafeEmitter } from '../observe/safe-emitter.ts';
import { publishTraced } from './traced-publish.ts';
import type { SafetyWarning } from '../brokers/safety.ts';
import { MailroomError } from '../errors.ts';
import { toMilliseconds, type Duration } from '../duration.ts';
import type { OutboxQueries } from '../events/outbox-queries.ts';
import type { Driver } from '../storage/driver.ts';
import { PeriodicPass, RUN_TO_END, type PassControl } from '../storage/periodic-pass.ts';
import { abortableDriver } from '../storage/abortable-driver.ts';
import { endOrCut, graceLeft, STOP_GRACE_MS, unlessAborted, within } from '../time-limit.ts';
import { inBatches } from '../storage/batches.ts';
import { findHolder, type HeldBackBy } from './held-back.ts';
import { knownCursorStillHeld, type KnownCursor } from './known-cursor.ts';
import type { ResolvedRelayOptions } from './options.ts';
import { planBatch, readFence, type OutboxPoint } from './read-batch.ts';
import { NO_TRANSACTION, readBatch, type ReadBatch } from './read-ahead.ts';
import type { RelayQueries } from './relay-queries.ts';
import { StoredEvent, storedRowOf } from './stored-event.ts';
import type { RelayedEvent, RelayTarget } from './target.ts';
import { ParkedEvents, type ParkedEvent } from './parking.ts';
import { RefusedEventError } from './refused.ts';
import { Waker } from '../worker/waker.ts';
import { WakeGate, type WakeGateQueries } from '../storage/wake-gate.ts';
import { ReadSize } from './read-size.ts';

/** Events a relay emits. */
export interface RelayEvents {
  /** A batch was delivered to a target and its cursor advanced. */
  delivered: [info: { target: string; count: number; cursor: { xid: string; position: string } }];
  /** Committed events wait behind an open transaction (emitted when it starts, then every 10 s while it lasts). */
  'held-back': [info: { target: string; waiting: number; heldBackBy: HeldBackBy }];
  'lease-acquired': [info: { target: string; token: string }];
  /** Another relay took the target over (this one had stopped renewing in time). */
  'lease-lost': [info: { target: string }];
  pruned: [info: { events: number; parked: number }];
  /** A target refused an event for good and it was parked (`onRefused: 'park'`): the events after it go on. */
  parked: [info: ParkedEvent];
  /** A target's broker setting breaks a guarantee (found at start; printed with console.warn when nobody listens). */
  warning: [warning: SafetyWarning];
  /** Infrastructure trouble (database unreachable, a target failing). The relay keeps going. */
  error: [error: unknown];
}

/** What one `flush()` did per target. */
export interface RelayFlushResult {
  /** Events delivered. */
  delivered: number;
  /** True when committed events still wait behind an open transaction. */
  heldBack: boolean;
  /** False when another relay holds the target's lease (nothing was done). */
  leased: boolean;
}

interface TargetState {
  target: RelayTarget;
  token: string | null;
  /** Rounds of one target never overlap within a process. */
  busy: Promise<unknown>;
  /** Cuts this target's sleep short (NOTIFY, stop). */
  waker: Waker;
  heldBackSince: number | null;
  lastHeldBackReport: number;
  /** A read-ahead target's next batch, read (and for a pipelined target sent) while the last one was being confirmed. */
  ahead: Promise<Ahead | null> | null;
  /** Rounds in a row that found events deliverable and delivered none (see {@link Relay.stalled}). */
  emptyAgain: number;
  /** The target's parked events its cursor has not passed: left out of its batches. */
  parked: ParkedEvents;
  /** How many rows the next read asks for. */
  readSize: ReadSize;
  /** A read-ahead target's cursor as this relay last read or advanced it (see known-cursor.ts); taken by each round. */
  known: KnownCursor | null;
}

/** A batch read ahead; `sent` settles with true when a pipelined target's conditional send of it was confirmed. */
interface Ahead {
  batch: ReadBatch;
  sent: Promise<boolean> | null;
}

type Round =
  | { kind: 'lost' }
  | { kind: 'done'; delivered: number; exhausted: boolean; blockedBy: bigint | null; fence: bigint; cursor: OutboxPoint };

class LeaseLost extends Error {}

const HELD_BACK_REPORT_MS = 10_000;
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
/** Rounds in a row that found events deliverable yet delivered none: past this, a relay stops and says so instead of spinning. */
const MAX_EMPTY_AGAIN = 100;

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
          await this.dropReadAhead(s);
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
          const after = await this.afterRound(s, round);
          if (after === 'again') {
            if (!this.stalled(s, round)) {
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
        const after = await this.afterRound(s, round);
        if (after === 'again') {
          if (this.stalled(s, round)) await this.sleep(s, this.options.pollMs);
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

  /**
   * One batch for one target, in one transaction: the fenced start (zero rows:
   * the lease is lost), the commit-safe read, the target's delivery, the cursor.
   */
  private async round(s: TargetState): Promise<Round> {
    if (s.target.readAhead === true) return this.readAheadRound(s);
    const token = s.token;
    if (token === null) return { kind: 'lost' };
    const name = s.target.name;
    const origin = await this.origin();
    const fence = await readFence(this.db, this.queries);
    let start: OutboxPoint | null = null;
    let sent: StoredEvent[] = [];
    try {
      // A relay paused with the round open (SIGSTOP) must not hold the cursor past its lease: the
      // server ends a transaction left idle that long.
      const result = await this.db.transaction(async (tx): Promise<Round> => {
        const begun = await tx.run<{ cursor_xid: string; cursor_position: string }>(this.queries.beginRound, [name, this.id, token, this.options.leaseMs]);
        const row = begun.rows[0];
        if (!row) return { kind: 'lost' };
        const cursor = { xid: BigInt(row.cursor_xid), position: BigInt(row.cursor_position) };
        start = cursor;
        const plan = await planBatch(tx, this.queries, cursor, fence, s.readSize.current);
        s.readSize.after(plan);
        if (plan.rows.length === 0 || plan.cursor === null) {
          return { kind: 'done', delivered: 0, exhausted: plan.exhausted, blockedBy: plan.blockedBy, fence, cursor };
        }
        const events = s.parked.without(plan.rows.map((row) => new StoredEvent(row)));
        sent = events;
        if (events.length > 0) await publishTraced(s.target, events, { tx, origin, signal: this.halt.signal });
        const next = plan.cursor;
        const advanced = await tx.run(this.queries.advance, [name, this.id, token, String(next.xid), String(next.position), events.length]);
        if (advanced.rowCount !== 1) throw new LeaseLost('lease lost during the round');
        return { kind: 'done', delivered: events.length, exhausted: plan.exhausted, blockedBy: plan.blockedBy, fence, cursor: next };
      }, { idleTimeoutMs: Math.max(1, Math.ceil(this.options.leaseMs)) });
      if (result.kind === 'done') s.parked.passed(result.cursor);
      if (result.kind === 'done' && result.delivered > 0) {
        const { xid, position } = result.cursor;
        this.emit('delivered', { target: name, count: result.delivered, cursor: { xid: String(xid), position: String(position) } });
      }
      return result;
    } catch (error) {
      if (error instanceof LeaseLost) return { kind: 'lost' };
      if (error instanceof RefusedEventError && start !== null) return this.refused(s, token, error, sent, fence, start);
      throw error;
    }
  }

  /**
   * A target refused one event of the batch for good: with `onRefused: 'park'`
   * the event is parked and the next round (at once) sends the batch without
   * it; with `'hold'`, or when the target named an event it was not given, the
   * refusal is a failed round like any other (retried with backoff).
   */
  private async refused(s: TargetState, token: string, error: RefusedEventError, events: readonly RelayedEvent[], fence: bigint, cursor: OutboxPoint): Promise<Round> {
    const name = s.target.name;
    const event = events.find((e) => storedRowOf(e).id === error.eventId);
    if (event === undefined) {
      throw new MailroomError(
        `relay target ${name} refused event ${error.eventId}, which is not in the batch it was given (${events.length} events from position ${events[0]?.position ?? '-'}); the batch is retried. A RefusedEventError must name an event of the batch by its envelope id`,
        { cause: error },
      );
    }
    if (this.options.onRefused === 'hold') {
      throw new MailroomError(
        `relay target ${name} refused event ${error.eventId} (position ${event.position}): ${error.reason}; with onRefused: 'hold' the relay retries it and delivers nothing after it to this target until the cause is fixed`,
        { cause: error },
      );
    }
    const parked = await s.parked.park(event, error.reason, this.id, token);
    if (parked === 'lost') return { kind: 'lost' };
    if (parked === 'again') {
      throw new MailroomError(`relay target ${name} refused event ${error.eventId} (position ${event.position}) again after it was parked: ${error.reason}`, { cause: error });
    }
    const type = storedRowOf(event).type;
    const info = { target: name, eventId: error.eventId, type, position: event.position, reason: error.reason };
    if (this.listenerCount('parked') > 0) this.emit('parked', info);
    else console.error(`[mailroom] relay ${this.id}: target ${name} refused event ${info.eventId} (${type}, position ${info.position}) for good; parked (see mailroom parked list ${name}): ${info.reason}`);
    return { kind: 'done', delivered: 0, exhausted: false, blockedBy: null, fence, cursor };
  }

  /**
   * One batch for a read-ahead target: the batch read during the previous
   * round's confirm (or read now), published; the next one read meanwhile
   * (and, for a pipelined target, sent at once, conditional on this one's last
   * event); then the cursor's fenced advance. A failed publish or a lost lease
   * drops the batch read ahead: the next round reads again from the cursor.
   */
  private async readAheadRound(s: TargetState): Promise<Round> {
    const token = s.token;
    if (token === null) return { kind: 'lost' };
    const name = s.target.name;
    const origin = await this.origin();
    const read = (from: OutboxPoint | null) =>
      readBatch({ driver: this.db, queries: this.queries, target: name, holder: this.id, token, leaseMs: this.options.leaseMs, batchSize: s.readSize.current, from });
    const ahead = s.ahead === null ? null : await s.ahead.catch((error: unknown) => (this.report(error), null));
    s.ahead = null;
    const known = s.known;
    s.known = null;
    let batch = ahead?.batch ?? null;
    let sent = ahead?.sent ?? null;
    let readAt = 0;
    let fromDatabase = false;
    if (batch === null || batch.token !== token) {
      await sent;
      sent = null;
      readAt = Date.now(); // after the wait for a send read ahead: the lease's age at the read itself
      const from = knownCursorStillHeld(known, token, readAt, this.options.leaseMs);
      fromDatabase = from === null;
      batch = await read(from);
    }
    if (batch === null) return { kind: 'lost' };
    const { plan } = batch;
    s.readSize.after(plan);
    const events = s.parked.without(batch.events);
    const { fence } = plan;
    if (plan.cursor === null || batch.events.length === 0) {
      // The cursor did not move: as read from the database just now (the lease renewed by that read), or as known before.
      s.known = fromDatabase ? { cursor: batch.from, token, renewedAt: readAt } : known;
      return { kind: 'done', delivered: 0, exhausted: plan.exhausted, blockedBy: plan.blockedBy, fence, cursor: batch.from };
    }
    const next = plan.cursor;
    // The batch before this one is confirmed: send this one as it is unless its conditional send was confirmed.
    const publishAgain = () => (events.length === 0 ? Promise.resolve() : publishTraced(s.target, events, { tx: NO_TRANSACTION, origin, signal: this.halt.signal }));
    const publishing = sent === null ? publishAgain() : sent.then((confirmed) => (confirmed ? undefined : publishAgain()));
    if (!plan.exhausted && plan.blockedBy === null) s.ahead = this.readNext(s, read(next), events.at(-1) ?? null, origin);
    try {
      await unlessAborted(publishing, this.halt.signal);
    } catch (error) {
      await this.dropReadAhead(s);
      if (error instanceof RefusedEventError) return this.refused(s, token, error, events, fence, batch.from);
      throw error;
    }
    const advancedAt = Date.now();
    const advanced = await this.db.run(this.queries.advanceNow, [name, this.id, token, String(next.xid), String(next.position), events.length, this.options.leaseMs]);
    if (advanced.rowCount !== 1) {
      await this.dropReadAhead(s);
      return { kind: 'lost' };
    }
    s.known = { cursor: next, token, renewedAt: advancedAt };
    s.parked.passed(next);
    if (events.length > 0) this.emit('delivered', { target: name, count: events.length, cursor: { xid: String(next.xid), position: String(next.position) } });
    return { kind: 'done', delivered: events.length, exhausted: plan.exhausted, blockedBy: plan.blockedBy, fence, cursor: next };
  }

  /**
   * The next batch, read; a pipelined target sends it as soon as it is read,
   * conditional on `after` (this batch's last event), so that the broker
   * confirms both batches in one wait. A send refused (the condition failed,
   * or anything else) is sent again by its own round, once this batch is confirmed.
   */
  private readNext(s: TargetState, reading: Promise<ReadBatch | null>, after: RelayedEvent | null, origin: string | undefined): Promise<Ahead | null> {
    return reading.then((batch) => {
      if (batch === null) return null;
      const events = s.parked.without(batch.events);
      if (s.target.pipelined !== true || after === null || events.length === 0 || batch.plan.cursor === null) return { batch, sent: null };
      const sent = publishTraced(s.target, events, { tx: NO_TRANSACTION, after, origin, signal: this.halt.signal }).then(
        () => true,
        () => false,
      );
      return { batch, sent };
    });
  }

  /** Forgets the batch read ahead, once its read and any conditional send of it have settled. */
  private async dropReadAhead(s: TargetState): Promise<void> {
    const ahead = s.ahead;
    s.ahead = null;
    const dropped = await ahead?.catch(() => null);
    if (dropped?.sent) await unlessAborted(dropped.sent, this.halt.signal).catch(() => {});
  }

  /**
   * After a round that found nothing more to deliver, with a fence read now:
   * `'again'` when rows committed meanwhile are deliverable (the round's fence
   * was older than they are), `'held-back'` when committed rows wait behind an
   * open transaction (reported, at most every 10 s), else `'idle'`.
   */
  private async afterRound(s: TargetState, round: Extract<Round, { kind: 'done' }>): Promise<'again' | 'held-back' | 'idle'> {
    const cursor = [String(round.cursor.xid), String(round.cursor.position)];
    const { rows } = await this.db.run<{ fence: string; ready: boolean; waiting: boolean }>(this.queries.afterCursor, cursor);
    const fence = BigInt(rows[0]!.fence);
    const { ready, waiting } = rows[0]!;
    // Deliverable now: rows that arrived below the new fence, or the row a round had to stop before.
    if (round.blockedBy !== null ? round.blockedBy < fence : ready && fence > round.fence) return 'again';
    if (!waiting && round.blockedBy === null) {
      s.heldBackSince = null;
      return 'idle';
    }
    const now = Date.now();
    s.heldBackSince ??= now;
    if (now - s.lastHeldBackReport >= HELD_BACK_REPORT_MS) {
      s.lastHeldBackReport = now;
      const heldBackBy = await findHolder(this.db, this.queries, fence);
      const count = (await this.db.run<{ count: number }>(this.queries.pastCursor, cursor)).rows[0]!.count;
      if (this.listenerCount('held-back') > 0) this.emit('held-back', { target: s.target.name, waiting: count, heldBackBy });
      else {
        const who = heldBackBy.pid === null ? `transaction ${heldBackBy.xid}` : `pid ${heldBackBy.pid} (open ${heldBackBy.ageSeconds}s)`;
        console.warn(`[mailroom] relay ${this.id}: ${count} committed event(s) for ${s.target.name} wait behind an open transaction: ${who}`);
      }
    }
    return 'held-back';
  }

  /**
   * Counts a round after which events were found deliverable: true (reported,
   * and the count started over) once {@link MAX_EMPTY_AGAIN} such rounds in a
   * row delivered nothing, so the caller stops looking at once.
   */
  private stalled(s: TargetState, round: Extract<Round, { kind: 'done' }>): boolean {
    s.emptyAgain = round.delivered > 0 ? 0 : s.emptyAgain + 1;
    if (s.emptyAgain < MAX_EMPTY_AGAIN) return false;
    s.emptyAgain = 0;
    this.report(
      new MailroomError(
        `relay ${this.id}: target ${s.target.name} found events deliverable ${MAX_EMPTY_AGAIN} times in a row and delivered none; ` +
          'it waits for its next poll instead of looking again at once. This is a mailroom bug: please report it with the output of `mailroom status`',
      ),
    );
    return true;
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
