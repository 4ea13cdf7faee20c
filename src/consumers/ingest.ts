/**
 * Stores what a broker source delivers, then acknowledges it: each message
 * becomes a job of the consumer group (deduplicated on the event's identity)
 * or a dead letter, in one transaction per batch, and the broker hears `ack`
 * only after that transaction committed. A crash between the commit and the
 * ack makes the broker redeliver; the redelivery conflicts on the job id and
 * is acknowledged without a second job (and the inbox catches a job that was
 * already pruned). While one batch is being stored the next one gathers, so
 * batches grow with the arrival rate up to the source's prefetch.
 */
import { stopController } from '../stop-controller.ts';
import type { ConsumerSource, SourceMessage } from '../brokers/source.ts';
import type { SafetyWarning } from '../brokers/safety.ts';
import type { Driver } from '../storage/driver.ts';
import { abortableDriver } from '../storage/abortable-driver.ts';
import { endOrCut, graceLeft, STOP_GRACE_MS, within } from '../time-limit.ts';
import { MailroomError } from '../errors.ts';
import { Waker } from '../worker/waker.ts';
import { isConcurrencyConflict } from '../storage/conflicts.ts';
import { startBatchSpan } from '../observe/tracing.ts';
import { decodeMessage, type DecodedDeadLetter, type DecodedEvent, type DecodedMessage, INVALID_MESSAGE_TYPE } from './decode-message.ts';
import type { IngestQueries } from './ingest-queries.ts';
import type { ClaimedRow } from '../worker/types.ts';
import type { HandOffRoom } from '../worker/worker.ts';

/** What one stored batch did. */
export interface IngestedInfo {
  group: string;
  /** Messages in the batch. */
  messages: number;
  /** New jobs of the group. */
  stored: number;
  /** Of those, jobs handed straight to the group's worker in this process (stored as claimed by it). */
  handed: number;
  /** Redeliveries of events already stored (no new job). */
  duplicates: number;
  /** Messages dead-lettered as `validation` or `unknown-type`. */
  deadLettered: number;
}

/** The part of the group's worker that a batch's jobs can be handed to. */
export interface HandOff {
  reserveHandOff(queue: string, max: number): HandOffRoom | null;
  adopt(rows: readonly ClaimedRow[], reserved: number, waiting: number): void;
  handOffRoom(queue: string): number | null;
  readonly capacity: number;
  roomChanged(ms: number): Promise<void>;
}

/** A stored job as the ingest statement returns it: `handed` ones carry what a claim returns. */
type StoredJob = ClaimedRow & { handed: boolean };

/** What an ingest needs from its consumer. */
export interface IngestDeps {
  driver: Driver;
  queries: IngestQueries;
  group: string;
  queue: string;
  types: ReadonlySet<string>;
  maxAttempts: number;
  maxAgeMs: number | null;
  maxMessageBytes: number;
  handlerTimeoutMs: number | null;
  /** Who stores (recorded with dead letters). */
  storedBy: string;
  /** The group's worker in this process, which takes jobs straight from a batch when it has room (see Worker.reserveHandOff). */
  handOff: HandOff;
  /** After the commit, before the acks. */
  onIngested(info: IngestedInfo): void;
  onWarning(warning: SafetyWarning): void;
  report(error: unknown): void;
}

const MAX_BATCH = 1000;
const MAX_RETRY_DELAY_MS = 5000;
/** The longest messages wait here for the group's worker to have room before they are stored anyway (see roomToStore). */
export const MAX_HOLD_MS = 1000;
/**
 * The least capacity (concurrency + prefetch) of the group's worker for which messages are held
 * for it (see roomToStore). Below it the batches held for its room would be too small: a group
 * at capacity 110 took a 30,000-event backlog more slowly held (batches of about 63) than stored
 * at once and claimed, and at capacity 10 at 60 % of the rate; at 250 (batches of about 160) it
 * was faster held (docs/BENCHMARKS.md, session 32).
 */
export const HOLD_MIN_CAPACITY = 200;

/** Feeds a consumer group from a broker source. */
export class SourceIngest {
  private state: 'idle' | 'running' | 'stopping' | 'stopped' = 'idle';
  private readonly buffer: SourceMessage[] = [];
  private draining: Promise<void> | null = null;
  private readonly retryWaker = new Waker();
  /** Ends a wait for the worker's room (see roomToStore) at once: the ingest is stopping. */
  private endHold: (() => void) | null = null;
  /** Aborted when a store is still in flight past the stop's timeout: its statements are cancelled. */
  private readonly halt = stopController();
  /** The driver the stores use: {@link halt} cancels what they run. */
  private readonly db: Driver;

  constructor(
    readonly source: ConsumerSource,
    private readonly deps: IngestDeps,
  ) {
    this.db = abortableDriver(deps.driver, this.halt.signal);
  }

  /** Starts the source; its safety warnings are reported as they are found. */
  async start(): Promise<void> {
    this.state = 'running';
    const { deps } = this;
    try {
      await this.source.start((message) => this.accept(message), {
        group: deps.group,
        handlerTimeoutMs: deps.handlerTimeoutMs,
        report: (error) => deps.report(error),
        warn: (warning) => deps.onWarning(warning),
      });
    } catch (error) {
      this.state = 'stopped';
      throw error;
    }
    if (this.source.check) {
      void this.source.check({ group: deps.group, handlerTimeoutMs: deps.handlerTimeoutMs }).then(
        (warnings) => warnings.forEach((w) => deps.onWarning(w)),
        (error: unknown) => deps.report(error),
      );
    }
  }

  /**
   * Stores and acknowledges what is in hand, gives back what could not be
   * stored, and stops the source. A store still in flight after `limitMs` (at
   * least a second: waiting for a lock, say) is cancelled and reported, and
   * its messages are given back. The source's own stop gets what is left of
   * `limitMs` (at least a second) and is then left behind, reported.
   */
  async stop(limitMs = Number.POSITIVE_INFINITY): Promise<void> {
    if (this.state === 'stopped' || this.state === 'idle') {
      this.state = 'stopped';
      return;
    }
    if (this.state === 'running') this.state = 'stopping';
    this.retryWaker.poke();
    this.endHold?.();
    const deadline = Date.now() + limitMs;
    const draining = this.draining ?? Promise.resolve();
    const waitMs = Math.max(STOP_GRACE_MS, limitMs);
    await endOrCut(draining, waitMs, {
      halt: this.halt,
      reason: new MailroomError(`consumer ${this.deps.group} stopped: a store was still in flight ${waitMs} ms into stop()`),
      onCut: () =>
        this.deps.report(
          new MailroomError(
            `consumer ${this.deps.group}: the store in flight from ${this.source.kind} ${this.source.name} did not end within ${waitMs} ms of stop() (its timeout, at least a second; ` +
              'a statement waiting for a lock, say). It was cancelled and rolled back, and its messages given back to the broker unacknowledged: the broker delivers them again',
          ),
        ),
    });
    for (const message of this.buffer.splice(0)) await settle(message.nack.bind(message), this.deps.report);
    // A source whose broker never answers its close is given what is left of the timeout (at least a second), then left behind.
    const closeMs = graceLeft(deadline);
    const closed = settle(() => this.source.stop(), this.deps.report).then(() => true);
    if (!(await within(closed, closeMs, false))) {
      this.deps.report(
        new MailroomError(
          `consumer ${this.deps.group}: ${this.source.kind} source ${this.source.name}'s stop() did not resolve within ${closeMs} ms (what was left of the stop's timeout, at least a second); ` +
            'the group stopped without waiting for it. Messages it delivered and mailroom did not acknowledge go back to the broker when its connection ends',
        ),
      );
    }
    this.state = 'stopped';
  }

  private accept(message: SourceMessage): void {
    if (this.state !== 'running') {
      void settle(message.nack.bind(message), this.deps.report);
      return;
    }
    this.buffer.push(message);
    this.kick();
  }

  private kick(): void {
    if (this.draining !== null) return;
    this.draining = this.drain().finally(() => {
      this.draining = null;
      if (this.buffer.length > 0 && this.state === 'running') this.kick();
    });
  }

  private async drain(): Promise<void> {
    while (this.buffer.length > 0 && this.state === 'running') {
      const take = this.takeNow() ?? (await this.roomToStore());
      if (this.state !== 'running') return; // stopping: what is buffered is nacked by stop()
      const batch = this.buffer.splice(0, take);
      const decoded = batch.map((m) => decodeMessage(m, this.deps.group, this.deps.types, this.deps.maxMessageBytes));
      const span = startBatchSpan(
        `consume ${this.source.name}`,
        'consumer',
        decoded.map((d) => (d.kind === 'event' ? d.traceparent : null)),
        { 'messaging.system': this.source.kind, 'messaging.destination.name': this.source.name, 'messaging.consumer.group.name': this.deps.group, 'messaging.batch.message_count': batch.length },
      );
      const info = await this.storeUntilDone(batch, decoded).finally(() => span.end());
      if (info === null) {
        this.buffer.unshift(...batch); // stopping: nacked by stop()
        return;
      }
      try {
        this.deps.onIngested(info);
      } catch (error) {
        this.deps.report(error);
      }
      await Promise.all(batch.map((message) => settle(message.ack.bind(message), this.deps.report)));
    }
  }

  /**
   * How many buffered messages to store now, or null to wait (see
   * {@link roomToStore}). While the group's worker is busy, they wait here,
   * unacknowledged (so the broker holds back the rest, up to the source's
   * prefetch), until it has room for as many as are buffered or for half its
   * capacity: then they are stored already claimed by it, with no claim of
   * their own, and a backlog on the broker reaches the worker as hand-offs.
   * Messages are not held when hand-offs are off (the worker is not running,
   * or the queue has shared limits) or the worker's capacity is below
   * HOLD_MIN_CAPACITY: they are stored at once, and those the worker has no
   * room for wait in the queue.
   */
  private takeNow(): number | null {
    const { handOff, queue } = this.deps;
    const room = handOff.handOffRoom(queue);
    if (room === null || handOff.capacity < HOLD_MIN_CAPACITY) return MAX_BATCH;
    if (room > 0 && room >= Math.min(this.buffer.length, Math.ceil(handOff.capacity / 2))) return Math.min(room, MAX_BATCH);
    return null;
  }

  /** Waits for the worker's room (see {@link takeNow}) for at most MAX_HOLD_MS; then, or once stopping, says store them all. */
  private async roomToStore(): Promise<number> {
    const until = Date.now() + MAX_HOLD_MS;
    for (;;) {
      const left = until - Date.now();
      if (left <= 0 || this.state !== 'running') return MAX_BATCH;
      await new Promise<void>((resolve) => {
        this.endHold = resolve;
        void this.deps.handOff.roomChanged(left).then(resolve);
      });
      this.endHold = null;
      const take = this.takeNow();
      if (take !== null) return take;
    }
  }

  /** Stores a batch, retrying with backoff while the database is unreachable; null when stopped first. */
  private async storeUntilDone(batch: readonly SourceMessage[], decoded: DecodedMessage[]): Promise<IngestedInfo | null> {
    let delay = 0;
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.storeSplittingBadRows(batch, decoded);
      } catch (error) {
        // A deadlock with another transaction on the same key rows was rolled back: the first is stored again at once, unreported.
        if (attempt === 1 && isConcurrencyConflict(error) && this.state === 'running') continue;
        if (error !== this.halt.signal.reason) this.deps.report(error); // a store the stop cut short: it said so
        if (this.state !== 'running') return null;
        delay = Math.min(MAX_RETRY_DELAY_MS, Math.max(100, delay * 2));
        await this.retryWaker.sleep(delay);
        if (this.state !== 'running') return null;
      }
    }
  }

  /**
   * Stores the batch in one transaction. When PostgreSQL refuses a value
   * (a data error, SQLSTATE class 22), stores the messages one by one and
   * dead-letters the one it refuses, so one bad message never blocks the rest.
   */
  private async storeSplittingBadRows(batch: readonly SourceMessage[], decoded: DecodedMessage[]): Promise<IngestedInfo> {
    try {
      return await this.store(decoded);
    } catch (error) {
      if (!isDataError(error)) throw error;
      if (decoded.length === 1) {
        const refused = refusedByDatabase(batch[0]!, decoded[0]!, error);
        return await this.store([refused]);
      }
      const total: IngestedInfo = { group: this.deps.group, messages: 0, stored: 0, handed: 0, duplicates: 0, deadLettered: 0 };
      for (let i = 0; i < decoded.length; i++) {
        const one = await this.storeSplittingBadRows([batch[i]!], [decoded[i]!]);
        total.messages += one.messages;
        total.stored += one.stored;
        total.handed += one.handed;
        total.duplicates += one.duplicates;
        total.deadLettered += one.deadLettered;
      }
      return total;
    }
  }

  /**
   * Stores a batch in one transaction. Jobs that may start at once (not
   * behind another job of their key), up to the room the group's worker has,
   * are stored already claimed by it and handed to it after the commit.
   */
  private async store(decoded: readonly DecodedMessage[]): Promise<IngestedInfo> {
    const events = decoded.filter((d): d is DecodedEvent => d.kind === 'event');
    const dead = decoded.filter((d): d is DecodedDeadLetter => d.kind === 'dead');
    const { deps } = this;
    const room = events.length > 0 ? deps.handOff.reserveHandOff(deps.queue, events.length) : null;
    // Filled once the transaction committed: what to hand to the worker, and how many stored jobs wait in the queue.
    let handed: StoredJob[] = [];
    let waiting = 0;
    try {
      let rows: StoredJob[] = [];
      await this.db.transaction(async (tx) => {
        if (events.length > 0) {
          const keys = events.map((e) => e.key);
          if (keys.some((key) => key !== null)) await tx.run(deps.queries.lockKeys, [keys, deps.queue]);
          ({ rows } = await tx.run<StoredJob>(deps.queries.storeEvents, [
            events.map((e) => e.jobId),
            events.map((e) => e.type),
            keys,
            events.map((e) => e.correlationId),
            events.map((e) => e.json),
            deps.queue,
            deps.maxAttempts,
            deps.maxAgeMs,
            room?.jobs ?? 0,
            room?.leaseMs ?? 0,
            room?.workerId ?? null,
          ]));
        }
        if (dead.length > 0) {
          await tx.run(deps.queries.storeDeadLetters, [
            dead.map((d) => d.jobId),
            dead.map((d) => d.type),
            dead.map((d) => d.category),
            dead.map((d) => d.message),
            dead.map((d) => d.json),
            dead.map((d) => d.correlationId),
            deps.queue,
            deps.storedBy,
          ]);
        }
      });
      const stored = rows.length;
      handed = rows.filter((row) => row.handed);
      waiting = rows.filter((row) => !row.handed && !row.blocked).length;
      return { group: deps.group, messages: decoded.length, stored, handed: handed.length, duplicates: events.length - stored, deadLettered: dead.length };
    } finally {
      // After a failure nothing is handed: rolled back, or, if the commit's outcome was lost, left to lease expiry.
      deps.handOff.adopt(handed, room?.jobs ?? 0, waiting);
    }
  }
}

/** PostgreSQL refused a value (SQLSTATE class 22: bad encoding, a number out of range, …). */
function isDataError(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' && code.startsWith('22');
}

function refusedByDatabase(message: SourceMessage, decoded: DecodedMessage, error: unknown): DecodedDeadLetter {
  const reason = error instanceof Error ? error.message : String(error);
  const body = typeof message.body === 'string' ? Buffer.from(message.body) : Buffer.from(message.body);
  return {
    kind: 'dead',
    jobId: decoded.jobId,
    type: decoded.kind === 'event' ? decoded.type : INVALID_MESSAGE_TYPE,
    category: 'validation',
    message: `PostgreSQL refused to store the message (${reason}); from ${message.origin}`,
    correlationId: null,
    json: JSON.stringify({ origin: message.origin, messageId: message.messageId ?? null, bytes: body.byteLength, body: body.subarray(0, 48 * 1024).toString('base64'), encoding: 'base64' }),
  };
}

async function settle(fn: () => void | Promise<void>, report: (error: unknown) => void): Promise<void> {
  try {
    await fn();
  } catch (error) {
    report(error);
  }
}
