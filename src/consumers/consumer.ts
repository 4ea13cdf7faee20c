import { SafeEmitter } from '../observe/safe-emitter.ts';
import { toMilliseconds, type Duration } from '../duration.ts';
import { MailroomError, RetryableError, ValidationError } from '../errors.ts';
import { fromEnvelope } from '../events/envelope.ts';
import { registerQueuePolicy } from '../worker/queue-policies.ts';
import { runInHandlerTx } from '../worker/handler-tx.ts';
import { runOf } from '../worker/job-run.ts';
import { currentContext, runInContext } from '../observe/context.ts';
import { retryHorizonMs } from '../retention.ts';
import { isSnooze } from '../snooze.ts';
import { isCancel } from '../cancel.ts';
import type { Driver, Transaction } from '../storage/driver.ts';
import { PeriodicPass, RUN_TO_END, type PassControl } from '../storage/periodic-pass.ts';
import { inBatches } from '../storage/batches.ts';
import type { FanOutQueries } from '../relay/fanout-queries.ts';
import { fanOut, INTERNAL_TARGET } from '../relay/internal-target.ts';
import { StoredEvent } from '../relay/stored-event.ts';
import { storedEventRow, unpackEventColumns, type PackedEventColumns } from '../events/envelope-sql.ts';
import type { Job, JobContext, JobHandler } from '../worker/types.ts';
import type { Worker, WorkerEvents, WorkerOptions } from '../worker/worker.ts';
import type { SafetyWarning } from '../brokers/safety.ts';
import type { ConsumerQueries } from './consumer-queries.ts';
import { inboxKeyOf } from './decode-message.ts';
import { InboxLookup } from './inbox-lookup.ts';
import { SourceIngest, type IngestedInfo } from './ingest.ts';
import type { IngestQueries } from './ingest-queries.ts';
import { definitionOfHandler, type ConsumerContext, type EventHandler } from './handle-event.ts';
import { checkedEvent } from './check-payload.ts';
import { resolveConsumerOptions, type ConsumerOptions, type ResolvedConsumerOptions } from './options.ts';

/** Events a consumer emits: its worker's, `duplicate`, and for a broker source `ingested` and `warning`. */
export interface ConsumerEvents extends WorkerEvents {
  /** A redelivered event was acknowledged without running the handler (its inbox key existed). */
  duplicate: [event: { id: string; type: string; group: string }];
  /** A batch of broker messages was stored (committed); the broker acks follow. */
  ingested: [info: IngestedInfo];
  /** A broker setting breaks a guarantee (printed with console.warn when nobody listens). */
  warning: [warning: SafetyWarning];
}

/** What a consumer needs from its mailroom. */
export interface ConsumerDeps {
  driver: Driver;
  queries: ConsumerQueries;
  fanOut: FanOutQueries;
  ingest: IngestQueries;
  makeWorker(options: WorkerOptions): Worker;
}

const BACKFILL_BATCH = 500;
const PRUNE_BATCH = 1000;
const MAX_PRUNE_BATCHES = 100;
const FORWARDED = ['started', 'completed', 'failed', 'snoozed', 'cancelled', 'stale', 'rate-limited', 'released'] as const;

/**
 * A consumer group for internal events: its subscription, and a worker on the
 * group's queue whose handlers keep an inbox, so each event takes effect once
 * for the group however often it is delivered. Made by `mailroom.consumer()`.
 */
export class Consumer extends SafeEmitter<ConsumerEvents> {
  readonly group: string;
  /** The queue the group's events wait in as jobs (`consumer.<group>`). */
  readonly queue: string;
  /** The worker that runs the group's handlers. */
  readonly worker: Worker;
  private readonly resolved: ResolvedConsumerOptions;
  /** Stores what the broker source delivers; null for internal events. */
  private readonly ingest: SourceIngest | null;
  /** Whether the group's inbox holds an event, asked for many handlers at once. */
  private readonly lookup: InboxLookup;
  /** The inbox prune in the background, while the group runs. */
  private pruning: PeriodicPass | undefined;
  private started = false;

  /** @internal use `mailroom.consumer()` */
  constructor(
    private readonly deps: ConsumerDeps,
    private readonly options: ConsumerOptions,
  ) {
    super();
    this.resolved = resolveConsumerOptions(options);
    this.group = this.resolved.group;
    this.queue = this.resolved.queue;
    this.lookup = new InboxLookup(deps.driver, deps.queries.inboxSeenAmong, this.group);
    // The group's jobs carry event types: the worker takes their retry policy, classifier and timeout from here.
    registerQueuePolicy(this.queue, { retry: this.resolved.retry, classify: this.resolved.classify, timeoutMs: this.resolved.timeoutMs });
    const handlers: Record<string, JobHandler> = {};
    for (const type of this.resolved.types) handlers[type] = this.wrap(options.handlers[type]!);
    this.worker = deps.makeWorker({
      queues: [this.queue],
      handlers,
      concurrency: options.concurrency,
      lease: options.lease,
      pollInterval: options.pollInterval,
      prefetch: options.prefetch,
      rateLimit: options.rateLimit,
      globalConcurrency: options.globalConcurrency,
      maintenance: options.maintenance,
    });
    for (const name of FORWARDED) this.worker.on(name, (...args: unknown[]) => (this.emit as (e: string, ...a: unknown[]) => boolean)(name, ...args));
    this.worker.on('error', (error) => this.report(error));
    const source = this.resolved.source;
    this.ingest =
      source === null
        ? null
        : new SourceIngest(source, {
            driver: deps.driver,
            queries: deps.ingest,
            group: this.group,
            queue: this.queue,
            types: new Set(this.resolved.types),
            maxAttempts: this.resolved.maxAttempts,
            maxAgeMs: this.resolved.maxAgeMs,
            maxMessageBytes: this.resolved.maxMessageBytes,
            handlerTimeoutMs: this.resolved.timeoutMs,
            storedBy: `${this.worker.id}/ingest`,
            handOff: this.worker,
            onIngested: (info) => this.emit('ingested', info),
            onWarning: (warning) => this.warn(warning),
            report: (error) => this.report(error),
          });
  }

  /** Where the group's events come from: `internal`, or the broker source (e.g. `rabbitmq billing`). */
  get source(): string {
    const source = this.resolved.source;
    return source === null ? 'internal' : `${source.kind} ${source.name}`;
  }

  /**
   * Registers the group's subscription (a new group starts at `from`), then
   * starts handling its events. Refuses an `inboxRetention` shorter than the
   * retry horizon of the group's events.
   *
   * @example
   * const billing = mailroom.consumer({ group: 'billing', handlers: { [orderCreated.type]: onOrderCreated } });
   * await billing.start();
   */
  async start(): Promise<void> {
    if (this.started) throw new MailroomError(`consumer ${this.group} was already started`);
    this.checkInboxRetention();
    this.started = true;
    try {
      await this.register();
    } catch (error) {
      this.started = false; // nothing started: start() may be called again
      throw error;
    }
    await this.worker.start();
    if (this.ingest !== null) {
      try {
        await this.ingest.start();
      } catch (error) {
        await this.worker.stop();
        this.started = false;
        throw error;
      }
    }
    if (this.options.maintenance !== false) {
      const every = Math.min(60_000, Math.max(1000, Math.floor(this.resolved.inboxRetentionMs / 10)));
      this.pruning = new PeriodicPass('inbox prune', every, (pass) => this.pruneInbox(pass), (error) => this.report(error));
      this.pruning.start();
    }
  }

  /**
   * Stops handling (graceful, like `worker.stop`). The subscription stays:
   * events keep arriving in the group's queue for the next start. A broker
   * source stops first: messages in hand are stored and acknowledged, or
   * given back to the broker. An inbox prune in flight ends after its current
   * batch, or has its statement cancelled after `timeout` (at least a second;
   * reported as an error); so has a store in flight, whose messages are then
   * given back to the broker. The timeout is one deadline for the whole
   * stop: the handlers get what the source's stop left of it, and a source
   * whose own stop does not resolve in time is left behind (reported).
   *
   * @example
   * await billing.stop({ timeout: '10s' });
   */
  async stop(options: { timeout?: Duration } = {}): Promise<void> {
    const limitMs = toMilliseconds(options.timeout ?? '30s', 'stop timeout');
    const deadline = Date.now() + limitMs;
    // One deadline for both: the worker's handlers get what the source's stop left of the timeout.
    const handling = async () => {
      await this.ingest?.stop(limitMs);
      await this.worker.stop({ timeout: Math.max(0, deadline - Date.now()) });
    };
    await Promise.all([this.pruning?.stop(limitMs), handling()]);
  }

  /**
   * Forgets inbox keys older than `inboxRetention`, in bounded batches. Runs on
   * its own while the consumer runs.
   *
   * @example
   * const { keys } = await billing.prune();
   */
  async prune(): Promise<{ keys: number }> {
    return { keys: await this.pruneInbox() };
  }

  private pruneInbox(pass: PassControl = RUN_TO_END): Promise<number> {
    const { signal } = pass;
    return inBatches(
      PRUNE_BATCH,
      MAX_PRUNE_BATCHES,
      () => this.deps.driver.run(this.deps.queries.pruneInbox, [this.group, this.resolved.inboxRetentionMs, PRUNE_BATCH], { signal }),
      () => pass.stopped(),
    );
  }

  /** The longest an event of the group can keep being retried; the inbox must remember it at least that long. */
  private checkInboxRetention(): void {
    const retry = this.resolved.retry;
    const horizon = retryHorizonMs({ retry, timeoutMs: this.resolved.timeoutMs });
    if (this.resolved.inboxRetentionMs < horizon) {
      throw new ValidationError(
        `consumer ${this.group}: inboxRetention (${this.resolved.inboxRetentionMs} ms) is shorter than the group's retry horizon (${horizon} ms: ${retry.maxAttempts} attempts, backoff up to ${retry.maxMs} ms${retry.maxAgeMs !== null ? `, maxAge ${retry.maxAgeMs} ms` : ''}${this.resolved.timeoutMs !== null ? `, runs of up to ${this.resolved.timeoutMs} ms` : ''}); a redelivery could arrive after its inbox key expired and run again. Raise inboxRetention or set a shorter retry.maxAge / maxAttempts`,
        [{ path: 'inboxRetention', message: 'shorter than the retry horizon' }],
      );
    }
  }

  /**
   * Upserts the group. A group of internal events is registered in a
   * transaction that holds the internal cursor (so no fan-out commits in
   * between), and a new `from: 'earliest'` one is backfilled with the events
   * already fanned out, in position order. A group reading from a broker
   * leaves the cursor alone: made for it, a cursor no relay moves would keep
   * every event from retention and read as an internal backlog.
   */
  private async register(): Promise<void> {
    const { driver, queries } = this.deps;
    const r = this.resolved;
    await driver.transaction(async (tx) => {
      let cursor: { cursor_xid: string; cursor_position: string } | null = null;
      if (r.source === null) {
        await tx.run(queries.ensureInternalCursor, [INTERNAL_TARGET]);
        const { rows } = await tx.run<{ cursor_xid: string; cursor_position: string }>(queries.lockInternalCursor, [INTERNAL_TARGET]);
        cursor = rows[0]!;
      }
      const { rows: registered } = await tx.run<{ created: boolean }>(queries.registerGroup, [
        r.group,
        r.queue,
        r.types,
        r.from === 'earliest',
        r.maxAttempts,
        r.maxAgeMs,
        r.inboxRetentionMs,
        r.source === null ? null : this.source,
      ]);
      if (registered[0]?.created && r.from === 'earliest' && cursor !== null) await this.backfill(tx, cursor.cursor_xid, cursor.cursor_position);
    });
  }

  private async backfill(tx: Transaction, cursorXid: string, cursorPosition: string): Promise<void> {
    let after = '0';
    for (;;) {
      const { rows } = await tx.run<PackedEventColumns>(this.deps.queries.deliveredOfTypes, [this.resolved.types, cursorXid, cursorPosition, after, BACKFILL_BATCH]);
      const events = rows.map((row) => new StoredEvent(storedEventRow(unpackEventColumns(row).columns)));
      await fanOut(tx, this.deps.fanOut, events, this.group);
      if (rows.length < BACKFILL_BATCH) return;
      after = events.at(-1)!.position;
    }
  }

  /**
   * The job handler around the user's. A redelivered event is found in the
   * inbox (one lookup for a burst of handlers), acknowledged and counted
   * without running the handler. Otherwise the event's inbox key commits with
   * the handler's work: when the handler opens `ctx.tx`, the key is its
   * transaction's first statement (a racing delivery waits for this one to
   * commit or roll back, then finds the key); when it never does, the key is
   * written with the job's batched completion, in the same statement.
   */
  private wrap(handler: EventHandler): JobHandler {
    const { queries } = this.deps;
    const group = this.group;
    const lookup = this.lookup;
    const typed = definitionOfHandler(handler);
    return async (job: Job, ctx: JobContext) => {
      const received = fromEnvelope(job.data);
      const inboxKey = inboxKeyOf(received);
      if (await lookup.seen(inboxKey)) {
        await runInHandlerTx(ctx.tx, queries.countDuplicate, [group]);
        this.emit('duplicate', { id: received.id, type: received.type, group });
        return undefined;
      }
      const event = await checkedEvent(received, typed, group);
      const run = runOf(ctx);
      if (run === undefined) throw new MailroomError(`consumer ${group}: a handler context without its job run (a bug in mailroom)`);
      let keyInTx = false;
      run.inboxKey = { group, key: inboxKey };
      run.txPrelude = async (tx) => {
        keyInTx = true;
        const recorded = await tx.run(queries.inboxRecord, [group, inboxKey]);
        if (recorded.rows.length === 0) {
          throw new RetryableError(`event ${event.id} (${event.type}) was handled by another delivery of it meanwhile; this delivery stops here`, { after: 0 });
        }
      };
      const consumerCtx: ConsumerContext = {
        get signal() {
          return ctx.signal;
        },
        get tx() {
          return ctx.tx;
        },
        workerId: ctx.workerId,
        step: (name, fn) => ctx.step(name, fn),
        idempotencyKey: (name) => ctx.idempotencyKey(name),
        isNewer: (entity, version) => ctx.isNewer(entity, version),
        group,
        job: { id: job.id, attempt: job.attempt, maxAttempts: job.maxAttempts },
      };
      // Work the handler causes names this event as its cause (and keeps the request's correlation id).
      // (Only when there is a request to follow: see execute.ts on the cost of AsyncLocalStorage.)
      const outer = currentContext();
      const result =
        outer === undefined && event.correlationId === null
          ? await handler(event, consumerCtx)
          : await runInContext({ ...outer, correlationId: event.correlationId ?? outer?.correlationId ?? null, eventId: event.id }, () => handler(event, consumerCtx));
      // For an event, cancel() means handled with nothing to do: acknowledged like a return, its inbox key kept.
      if (isCancel(result)) return undefined;
      if (isSnooze(result) && keyInTx) {
        // Not handled yet: the key goes again (the reschedule commits with ctx.tx).
        await runInHandlerTx(ctx.tx, queries.inboxForget, [group, inboxKey]);
      }
      return result;
    };
  }

  private warn(warning: SafetyWarning): void {
    if (this.listenerCount('warning') > 0) this.emit('warning', warning);
    else console.warn(`[mailroom] consumer ${this.group}: ${warning.subject}: ${warning.message} (${warning.code})`);
  }

  private report(error: unknown): void {
    if (this.listenerCount('error') > 0) this.emit('error', error);
    else console.error(`[mailroom] consumer ${this.group}:`, error instanceof Error ? error.message : error);
  }
}
