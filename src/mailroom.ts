import type { PGlite } from '@electric-sql/pglite';
import { checkOptionNames, type OptionNames } from './option-names.ts';
import { closest } from './closest.ts';
import type pg from 'pg';
import type { JobDefinition } from './define.ts';
import { quoteSchema } from './identifiers.ts';
import { enqueueJobs, enqueueOptionsOf, type EnqueueManyOptions, type EnqueueOptions } from './jobs/enqueue.ts';
import { getJob, type JobInfo } from './jobs/get.ts';
import { jobQueries, type JobQueries } from './jobs/queries.ts';
import { stepQueries, type StepQueries } from './jobs/step-queries.ts';
import { DEFAULT_MAX_PAYLOAD_BYTES } from './payload.ts';
import { connect, type DatabaseOption } from './storage/connect.ts';
import { resolveStallCheck, type StallCheckOptions } from './storage/stall-check-options.ts';
import type { StallCheck } from './storage/stalled-statements.ts';
import { asQueryable, type Driver, type Queryable, type TransactionLike } from './storage/driver.ts';
import { adminQueries, type AdminQueries } from './jobs/admin-queries.ts';
import { cancelJob, retryJob, type JobActionResult } from './jobs/admin.ts';
import { correlationQueries } from './jobs/correlation-queries.ts';
import { readCorrelation, type ByCorrelationOptions, type CorrelationTrail } from './jobs/correlation.ts';
import { readStats, type MailroomStats } from './stats.ts';
import { advanceVersion } from './versions.ts';
import { checkRetentionAgainst, resolveRetention, type RetentionOptions, type RetentionPolicy } from './retention.ts';
import { retentionQueries } from './jobs/retention-queries.ts';
import { controlQueries, type ControlQueries } from './jobs/control-queries.ts';
import { findJob, registeredJobs } from './registry.ts';
import { migrate, type MigrationProgress } from './storage/migrations.ts';
import { explainDatabaseError } from './storage/explain.ts';
import { Maintenance } from './worker/maintenance.ts';
import { Worker, type WorkerOptions } from './worker/worker.ts';
import { toMilliseconds, type Duration } from './duration.ts';
import { TransactionEndedError, ValidationError } from './errors.ts';
import { transactionOptionsOf, type MailroomTransactionOptions } from './transaction-options.ts';
import type { EventDefinition } from './events/define-event.ts';
import { assertSource, defaultSource } from './events/envelope.ts';
import { readEventStats } from './events/event-stats.ts';
import { outboxQueries, type OutboxQueries } from './events/outbox-queries.ts';
import { checkItems, publishEvents } from './events/publish.ts';
import type { PublishManyOptions, PublishOptions } from './events/publish-options.ts';
import { Relay } from './relay/relay.ts';
import { relayQueries, type RelayQueries } from './relay/relay-queries.ts';
import { wakeGateQueries, type WakeGateQueries } from './storage/wake-gate.ts';
import { resolveRelayOptions, type RelayOptions } from './relay/options.ts';
import { fanOutQueries, type FanOutQueries } from './relay/fanout-queries.ts';
import { internalTarget } from './relay/internal-target.ts';
import { Consumer } from './consumers/consumer.ts';
import { consumerQueries, type ConsumerQueries } from './consumers/consumer-queries.ts';
import { ingestQueries, type IngestQueries } from './consumers/ingest-queries.ts';
import type { ConsumerOptions } from './consumers/options.ts';
import { SafeEmitter } from './observe/safe-emitter.ts';
import type { MailroomEvents } from './observe/lifecycle.ts';
import { checkRedactPaths, redact } from './observe/redact.ts';
import { deadLettersApi, type DeadLettersApi } from './dead-letters/api.ts';
import { parkedEventsApi, type ParkedEventsApi } from './relay/parked-api.ts';
import { removeRelayTarget, type RelayTargetsApi } from './relay/remove-target.ts';
import { removeTargetQueries } from './relay/remove-target-queries.ts';
import { removeConsumerGroup, type ConsumerGroupsApi } from './consumers/remove-group.ts';
import { parkedQueries } from './relay/parked-queries.ts';
import { deadLetterQueries } from './dead-letters/dead-letter-queries.ts';
import { withReplayHistory } from './dead-letters/history.ts';
import { checkMetricsOptions, createMetrics, type MailroomMetrics, type MetricsOptions } from './observe/metrics.ts';
import type { Registry } from 'prom-client';
import { emitRescued, forwardConsumer, forwardRelay, forwardWorker, LazyForwarding } from './observe/forward.ts';
import { attachLogger, checkLogger, type MailroomLogger } from './observe/logger.ts';
import { checkQueueSettings, type QueueSettings } from './queue-settings.ts';
import { refreshStatistics, statisticsQueries, type AnalyzedTable } from './storage/statistics.ts';

/** Options of {@link createMailroom}. */
export interface MailroomOptions {
  /**
   * A `postgres://` URL, a `pg.Pool` or a PGlite instance. Unset: `DATABASE_URL`,
   * else an embedded PGlite database in `./.mailroom`.
   */
  database?: string | pg.Pool | PGlite;
  /** PostgreSQL schema for mailroom's tables. Default `'mailroom'`. */
  schema?: string;
  /** Largest payload accepted, in bytes (JSON). Default 1 MiB. */
  maxPayloadBytes?: number;
  /**
   * Connections in the pool mailroom opens for a URL. Default 20. A handler using
   * `ctx.tx` holds one for its whole run: keep it above the workers' total concurrency plus 3.
   */
  poolSize?: number;
  /** How often workers look for expired leases. Default `'5s'`. */
  rescueInterval?: Duration;
  /** How long finished jobs are kept (completed 7 days, dead 14 days by default). */
  retention?: RetentionOptions;
  /** CloudEvents `source` of published events (an event definition may name its own). Default `mailroom://<host name>`. */
  source?: string;
  /**
   * Settings per queue name. `owner`: the team that owns the queue; it labels
   * the queue's metrics (and so its alerts) and its dead letters.
   */
  queues?: Record<string, QueueSettings>;
  /**
   * Payload fields hidden (`[redacted]`) in every output that shows a payload:
   * dead letters, `jobs.get`, the command line. A plain name (`password`)
   * matches at any depth; a dot path (`card.number`) matches that field.
   */
  redact?: string[];
  /**
   * Where mailroom writes its log lines (failures, dead letters, rescues,
   * warnings, errors; per-job lines at debug): pino or any logger with
   * `error/warn/info(fields, message)`. Unset: errors and warnings go to the console.
   */
  logger?: MailroomLogger;
  /**
   * Prometheus metrics (`mailroom.metrics()`): the scaling signal's drain target
   * and per-worker concurrency, and a prefix for every metric name.
   */
  metrics?: MetricsOptions;
  /**
   * When a PostgreSQL connection that stopped answering is given up on (a
   * failover, a partition, a NAT that dropped it): a statement unanswered for
   * `after` (default `'15s'`) is looked up on the server every `every`
   * (`'5s'`), each look taking at most `answer` (`'10s'`). `false` switches
   * it off. No effect on PGlite. See docs/STORAGE.md.
   */
  stallCheck?: StallCheckOptions | false;
}

export type { QueueSettings } from './queue-settings.ts';

/** The transaction handle `mailroom.transaction()` gives: run SQL, and pass it as `{ tx }`. */
export interface MailroomTransaction extends Queryable {}

/** Read and act on single jobs. */
export interface JobsApi {
  /**
   * A job's state, human status, attempts, errors and history.
   *
   * @example
   * const job = await mailroom.jobs.get(id); console.log(job?.status);
   */
  get(id: string): Promise<JobInfo | undefined>;
  /**
   * Cancels a waiting or dead job (an active one is left to finish).
   *
   * @example
   * const { changed, state } = await mailroom.jobs.cancel(id);
   */
  cancel(id: string): Promise<JobActionResult>;
  /**
   * Runs a job again now; a dead or cancelled job gets a fresh budget of attempts.
   * Throws when its dedup key belongs to an unfinished job now (the error names it).
   *
   * @example
   * await mailroom.jobs.retry(id);
   */
  retry(id: string): Promise<JobActionResult>;
  /**
   * Everything one request caused: every job (of any queue, consumer groups'
   * included) and every outbox event carrying `correlationId`, each oldest
   * first, events with the relay targets that have published them.
   *
   * @example
   * const { jobs, events } = await mailroom.jobs.byCorrelation('req-42');
   */
  byCorrelation(correlationId: string, options?: ByCorrelationOptions): Promise<CorrelationTrail>;
}

/** Monotonic versions per entity, to ignore outdated updates. */
export interface VersionsApi {
  /**
   * Records `version` for `entity` if newer than any recorded; true when it was.
   * Pass `tx` to make it part of the update it guards.
   *
   * @example
   * await mailroom.transaction(async (tx) => {
   *   if (await mailroom.versions.advance(`customer:${id}`, v, { tx })) await tx.query('UPDATE customers ...');
   * });
   */
  advance(entity: string, version: number | bigint, options?: { tx?: TransactionLike }): Promise<boolean>;
}

/**
 * A mailroom instance: enqueue jobs, run workers, read job state. Made by
 * {@link createMailroom}.
 */
export class Mailroom extends SafeEmitter<MailroomEvents> {
  readonly schema: string;
  /** Payload fields hidden in every output (the `redact` option). */
  readonly redactPaths: readonly string[];
  private readonly queueSettings: Readonly<Record<string, QueueSettings>>;
  private readonly forwarding: LazyForwarding;
  private readonly metricsOptions: MetricsOptions;
  private metricsState: MailroomMetrics | undefined;
  readonly jobs: JobsApi;
  /** The dead-letter queue: list, show, replay and discard by filter (docs/DEAD-LETTERS.md). */
  readonly deadLetters: DeadLettersApi;
  /** Events relay targets refused for good: list, republish and discard (docs/EVENTS.md, "Events a target refuses"). */
  readonly parkedEvents: ParkedEventsApi;
  /** Consumer groups: remove one that no longer runs (docs/EVENTS.md, "Removing a group"). */
  readonly consumerGroups: ConsumerGroupsApi;
  /**
   * Relay targets: remove one that no relay runs any more (its cursor holds outbox retention back).
   *
   * @example
   * await mailroom.relayTargets.remove('rabbitmq:orders-old');
   */
  readonly relayTargets: RelayTargetsApi;
  readonly versions: VersionsApi;
  private readonly retention: RetentionPolicy;
  private readonly admin: AdminQueries;
  private readonly quotedSchema: string;
  private readonly controlQueries: ControlQueries;
  private readonly queries: JobQueries;
  private readonly stepQueries: StepQueries;
  private readonly maintenance: Maintenance;
  private readonly workers = new Set<Worker>();
  private readonly relays = new Set<Relay>();
  private readonly consumers = new Set<Consumer>();
  private readonly outboxQueries: OutboxQueries;
  private readonly relayQueries: RelayQueries;
  private readonly wakeQueries: WakeGateQueries;
  private readonly consumerQueries: ConsumerQueries;
  private readonly ingestQueries: IngestQueries;
  private readonly fanOutQueries: FanOutQueries;
  private readonly source: string;

  /** @internal use {@link createMailroom} */
  constructor(
    private readonly driver: Driver,
    options: MailroomOptions,
  ) {
    super();
    this.forwarding = new LazyForwarding(this);
    // Checked by createMailroom before it connects.
    this.redactPaths = options.redact ?? [];
    if (options.logger !== undefined) attachLogger(this, options.logger);
    this.queueSettings = { ...options.queues };
    this.metricsOptions = { ...options.metrics };
    this.schema = options.schema ?? 'mailroom';
    this.quotedSchema = quoteSchema(this.schema);
    this.queries = jobQueries(this.quotedSchema);
    this.stepQueries = stepQueries(this.quotedSchema);
    this.controlQueries = controlQueries(this.quotedSchema);
    this.outboxQueries = outboxQueries(this.quotedSchema);
    this.relayQueries = relayQueries(this.quotedSchema);
    this.wakeQueries = wakeGateQueries(this.quotedSchema);
    this.consumerQueries = consumerQueries(this.quotedSchema);
    this.ingestQueries = ingestQueries(this.quotedSchema);
    this.fanOutQueries = fanOutQueries(this.quotedSchema);
    this.source = options.source ?? defaultSource();
    this.maxPayloadBytes = options.maxPayloadBytes ?? DEFAULT_MAX_PAYLOAD_BYTES;
    const rescueMs = toMilliseconds(options.rescueInterval ?? '5s', 'rescueInterval');
    this.retention = resolveRetention(options.retention);
    const statistics = statisticsQueries(this.quotedSchema);
    this.maintenance = new Maintenance(driver, this.queries, retentionQueries(this.quotedSchema), this.retention, Math.max(10, rescueMs), (error) => {
        const explained = this.explain(error);
        if (this.listenerCount('error') > 0) this.emit('error', { origin: { component: 'maintenance' }, error: explained });
        else console.error('[mailroom] maintenance:', explained.message);
      },
      (job) => emitRescued(this, job),
      (signal) => refreshStatistics(driver, statistics, this.quotedSchema, signal),
    );
    const admin = adminQueries(this.quotedSchema);
    this.admin = admin;
    const correlation = correlationQueries(this.quotedSchema);
    const deadLetters = deadLetterQueries(this.quotedSchema);
    this.deadLetters = deadLettersApi({
      driver: this.driver,
      queries: deadLetters,
      jobQueries: this.queries,
      redactPaths: this.redactPaths,
      ownerOf: (queue) => this.ownerOf(queue),
      wakeChannel: `${this.schema}_wakeup`,
      fail: (e) => this.fail(e),
    });
    this.parkedEvents = parkedEventsApi({ driver: this.driver, queries: parkedQueries(this.quotedSchema), fail: (e) => this.fail(e) });
    this.consumerGroups = { remove: (group, options) => removeConsumerGroup(this.driver, this.consumerQueries, group, options).catch((e) => this.fail(e)) };
    const targetQueries = removeTargetQueries(this.quotedSchema);
    this.relayTargets = { remove: (target) => removeRelayTarget(this.driver, targetQueries, target).catch((e) => this.fail(e)) };
    this.jobs = {
      get: (id) =>
        getJob(this.driver, this.queries, id)
          .then((info) => withReplayHistory(this.driver, deadLetters, info))
          .then((info) => info && { ...info, data: redact(info.data, this.redactPaths) })
          .catch((e) => this.fail(e)),
      cancel: (id) => cancelJob(this.driver, admin, id).catch((e) => this.fail(e)),
      retry: (id) => retryJob(this.driver, admin, id).catch((e) => this.fail(e)),
      byCorrelation: (correlationId, opts) => readCorrelation(this.driver, correlation, correlationId, opts).catch((e) => this.fail(e)),
    };
    this.versions = {
      advance: (entity, version, opts = {}) =>
        advanceVersion(opts.tx !== undefined && opts.tx !== null ? asQueryable(opts.tx) : this.driver, this.quotedSchema, entity, version).catch((e) => this.fail(e)),
    };
  }

  private readonly maxPayloadBytes: number;

  /**
   * The team that owns `queue` (the `queues` option), or null.
   *
   * @example
   * mailroom.ownerOf('email'); // 'growth'
   */
  ownerOf(queue: string): string | null {
    return this.queueSettings[queue]?.owner ?? null;
  }

  /** Which driver is in use: `'pg'` (a server) or `'pglite'` (embedded). */
  get databaseKind(): 'pg' | 'pglite' {
    return this.driver.kind;
  }

  /**
   * Creates or upgrades mailroom's tables. Safe to run from several processes at once.
   * `onProgress` hears each migration before it is applied, and the end.
   *
   * @example
   * await mailroom.migrate();
   */
  async migrate(options: { onProgress?: MigrationProgress } = {}): Promise<{ applied: number[] }> {
    return migrate(this.driver, this.schema, options.onProgress).catch((e) => this.fail(e));
  }

  /**
   * Adds a job; returns its id. With `tx` it exists only if that transaction commits.
   *
   * @example
   * const id = await mailroom.enqueue(sendWelcome, { userId: 'u1' }, { key: 'welcome:u1', delay: '5m' });
   */
  async enqueue<TData, TInput>(def: JobDefinition<TData, TInput>, data: TInput, options: EnqueueOptions = {}): Promise<string> {
    const { key, ...rest } = enqueueOptionsOf(options);
    const many: EnqueueManyOptions<TInput> = key === undefined ? rest : { ...rest, key: () => key };
    const ids = await enqueueJobs(this.driver, this.queries, this.maxPayloadBytes, def, [data], many, this.retention.dedupKeysMs).catch((e) =>
      this.fail(e),
    );
    this.enqueued(def, ids, rest.tx !== undefined);
    return ids[0]!;
  }

  /**
   * Adds many jobs of one type in one statement; returns their ids in order.
   *
   * @example
   * await mailroom.enqueueMany(sendWelcome, users.map((u) => ({ userId: u.id })), { key: (d) => `welcome:${d.userId}` });
   */
  async enqueueMany<TData, TInput>(def: JobDefinition<TData, TInput>, data: readonly TInput[], options: EnqueueManyOptions<TInput> = {}): Promise<string[]> {
    if (!Array.isArray(data)) throw new ValidationError('enqueueMany: data must be an array', [{ path: 'data', message: 'not an array' }]);
    const checked = enqueueOptionsOf(options);
    const ids = await enqueueJobs(this.driver, this.queries, this.maxPayloadBytes, def, data, checked, this.retention.dedupKeysMs).catch((e) => this.fail(e));
    this.enqueued(def, ids, checked.tx !== undefined);
    return ids;
  }

  private enqueued(def: { name: string; queue: string }, ids: string[], inTransaction: boolean): void {
    if (ids.length > 0 && this.listenerCount('job.enqueued') > 0) this.emit('job.enqueued', { type: def.name, queue: def.queue, ids, inTransaction });
  }

  /**
   * Runs `fn` in a transaction; pass its `tx` to `enqueue` so jobs commit or
   * roll back with your own writes.
   *
   * `options.signal` ends it when aborted (see {@link MailroomTransactionOptions}).
   *
   * @example
   * await mailroom.transaction(async (tx) => {
   *   await tx.query('INSERT INTO users (id) VALUES ($1)', [id]);
   *   await mailroom.enqueue(sendWelcome, { userId: id }, { tx });
   * }, { signal: AbortSignal.timeout(5_000) });
   */
  async transaction<T>(fn: (tx: MailroomTransaction) => Promise<T>, options?: MailroomTransactionOptions): Promise<T> {
    const { signal } = transactionOptionsOf(options);
    return this.driver.transaction(async (tx) => {
      let ended = false;
      const handle: MailroomTransaction = {
        query: (sql, params) => {
          // After fn settled the connection is back in the pool (maybe in someone else's transaction).
          if (ended) return Promise.reject(new TransactionEndedError('this mailroom.transaction() tx was used after its function returned; its transaction has ended, and nothing was run'));
          return tx.query(sql, params);
        },
      };
      try {
        return await fn(handle);
      } finally {
        ended = true;
      }
    }, signal ? { signal } : {});
  }

  /**
   * Publishes an event through the transactional outbox: one row, written in
   * `tx` when given (it exists if and only if that transaction commits), and
   * delivered by a relay afterwards. Validates the payload against the
   * definition's schema and every option first; writes nothing when anything
   * is wrong.
   *
   * @example
   * await mailroom.transaction(async (tx) => {
   *   await tx.query('INSERT INTO orders (id, total) VALUES ($1, $2)', [orderId, total]);
   *   await mailroom.publish(orderCreated, { orderId, total }, { tx, key: orderId, correlationId });
   * });
   */
  async publish<TData, TInput>(event: EventDefinition<TData, TInput>, data: TInput, options: PublishOptions = {}): Promise<{ id: string }> {
    const { key, ...rest } = options ?? {};
    const many: PublishManyOptions<TInput> = key === undefined ? rest : { ...rest, key };
    const [id] = await publishEvents(this.publishDeps(), event, [data], many).catch((e) => this.fail(e));
    return { id: id! };
  }

  /**
   * Publishes several events of one type in one statement, in order (per key,
   * they are delivered in this order). `key` may be a function of each item.
   *
   * @example
   * await mailroom.publishMany(itemShipped, items, { tx, key: (item) => item.orderId });
   */
  async publishMany<TData, TInput>(event: EventDefinition<TData, TInput>, data: readonly TInput[], options: PublishManyOptions<TInput> = {}): Promise<{ ids: string[] }> {
    checkItems(data);
    const ids = await publishEvents(this.publishDeps(), event, data, options ?? {}).catch((e) => this.fail(e));
    return { ids };
  }

  private publishDeps() {
    return { driver: this.driver, queries: this.outboxQueries, maxPayloadBytes: this.maxPayloadBytes, source: this.source };
  }

  /**
   * Makes a relay: it delivers committed events from the outbox to the consumer
   * groups (and to `to` targets), in commit-safe order. Several may run; each
   * target is delivered by one at a time. Call `start()` on it.
   *
   * @example
   * const relay = mailroom.relay({ batchSize: 200, lease: '30s', retention: '7d' });
   * await relay.start();
   */
  relay(options: RelayOptions = {}): Relay {
    const resolved = resolveRelayOptions(options, internalTarget(this.fanOutQueries));
    const relay = new Relay(this.driver, this.relayQueries, this.outboxQueries, this.wakeQueries, `${this.schema}_outbox`, resolved, this.maxPayloadBytes, (signal) =>
      this.maintenance.analyzeStale(signal),
    );
    forwardRelay(relay, this, this.forwarding);
    this.relays.add(relay);
    return relay;
  }

  /**
   * Makes a consumer group: each event of the types it handles (published
   * here and relayed, or read from a broker `source`) becomes a job in its
   * queue (`consumer.<group>`, the event's key as ordering key), run with an
   * inbox so it takes effect once. Call `start()`.
   *
   * @example
   * const billing = mailroom.consumer({ group: 'billing', handlers: {
   *   [orderCreated.type]: handleEvent(orderCreated, async (event, ctx) => { await ctx.tx.query('…', [event.data.orderId]); }),
   * } });
   * await billing.start();
   * // from a broker: mailroom.consumer({ group: 'billing', source: rabbitmqSource({ url, queue: 'billing' }), handlers })
   */
  consumer(options: ConsumerOptions): Consumer {
    const consumer = new Consumer(
      { driver: this.driver, queries: this.consumerQueries, fanOut: this.fanOutQueries, ingest: this.ingestQueries, makeWorker: (workerOptions) => this.makeWorker(workerOptions, false) },
      options,
    );
    forwardConsumer(consumer, this, this.forwarding);
    this.consumers.add(consumer);
    return consumer;
  }

  /**
   * Makes a worker for some queues. Call `start()` on it.
   *
   * @example
   * const worker = mailroom.worker({ queues: ['email'], concurrency: 5, handlers: { [sendWelcome.name]: async (job) => send(job.data) } });
   * await worker.start();
   */
  worker(options: WorkerOptions): Worker {
    const worker = this.makeWorker(options, true);
    warnMisnamedHandlers(options);
    return worker;
  }

  /** A worker whose job events reach `mailroom.on`; `errors`: its errors too (a consumer's worker reports through its consumer). */
  private makeWorker(options: WorkerOptions, errors: boolean): Worker {
    checkRetentionAgainst(
      this.retention,
      Object.keys(options.handlers ?? {}).flatMap((name) => {
        const def = findJob(name);
        return def ? [def] : [];
      }),
    );
    const maintenance = options.maintenance === false ? undefined : this.maintenance;
    const worker = new Worker(this.driver, this.queries, this.stepQueries, this.controlQueries, this.quotedSchema, `${this.schema}_wakeup`, options, maintenance);
    forwardWorker(worker, this, this.forwarding, { errors });
    this.workers.add(worker);
    return worker;
  }

  /**
   * Health numbers per queue (counts by state, age of the oldest available job,
   * completions and failures per second over the last minute), per relay target
   * (unpublished events, lag, the transaction holding it back) and per consumer
   * group (lag, duplicates rejected).
   *
   * @example
   * const { queues } = await mailroom.stats(); console.log(queues.email?.oldestAgeSeconds);
   */
  async stats(): Promise<MailroomStats> {
    const [base, events] = await Promise.all([readStats(this.driver, this.admin), readEventStats(this.driver, this.relayQueries, this.consumerQueries)]).catch((e) =>
      this.fail(e),
    );
    return { ...base, ...events };
  }

  /**
   * Prometheus text exposition: per queue depth, age, rates, durations, dead
   * letters and `mailroom_desired_workers`; relay and consumer lag; process
   * metrics (docs/OPERATIONS.md). Serve it with {@link metricsContentType}.
   *
   * @example
   * res.setHeader('Content-Type', mailroom.metricsContentType); res.end(await mailroom.metrics());
   */
  async metrics(): Promise<string> {
    return this.metricsOf().text();
  }

  /**
   * The Content-Type of {@link metrics}' text (Prometheus text format 0.0.4).
   *
   * @example
   * res.writeHead(200, { 'content-type': mailroom.metricsContentType });
   */
  get metricsContentType(): string {
    return this.metricsOf().registry.contentType;
  }

  /**
   * This instance's prom-client Registry (never the global one), to merge with
   * your own. Made on first use of it, `metrics()` or `metricsContentType`;
   * event counters count from then on, so touch it at startup.
   *
   * @example
   * const registry = Registry.merge([mailroom.metricsRegistry, appRegistry]);
   */
  get metricsRegistry(): Registry {
    return this.metricsOf().registry;
  }

  private metricsOf(): MailroomMetrics {
    return (this.metricsState ??= createMetrics(this, this.metricsOptions));
  }

  /**
   * Runs maintenance once now: rescues jobs whose lease expired, prunes
   * finished jobs past their retention, and analyzes the tables (jobs, outbox,
   * inbox) that grew past twice the size their planner statistics recorded,
   * where autovacuum does not (PGlite, or a server with autovacuum off).
   * Workers do this on their own.
   *
   * @example
   * const { rescued, pruned, analyzed } = await mailroom.maintain();
   */
  async maintain(): Promise<{ rescued: number; pruned: number; analyzed: AnalyzedTable[] }> {
    const rescued = await this.maintenance.rescueExpired().catch((e) => this.fail(e));
    const pruned = await this.maintenance.prune().catch((e) => this.fail(e));
    const analyzed = await this.maintenance.analyzeStale().catch((e) => this.fail(e));
    return { rescued, pruned, analyzed };
  }

  /**
   * Stops every relay, consumer group and worker at once (graceful: each waits
   * up to `timeout`, default 30 s, for its handlers and background passes) and
   * closes the connection mailroom opened.
   *
   * @example
   * await mailroom.close();
   */
  async close(options: { timeout?: Duration } = {}): Promise<void> {
    // All at once, so that `timeout` bounds the whole close (one after the other, handlers of groups
    // and of workers were each given the whole timeout in turn).
    await Promise.all([...[...this.relays].map((r) => r.stop(options)), ...[...this.consumers].map((c) => c.stop(options)), ...[...this.workers].map((w) => w.stop(options))]);
    await this.driver.close();
  }

  private explain(error: unknown): Error {
    return explainDatabaseError(error, this.schema, this.driver.location);
  }

  private fail(error: unknown): never {
    throw this.explain(error);
  }
}

/**
 * Opens mailroom on a database. Call `migrate()` once before use.
 *
 * @example
 * const mailroom = await createMailroom({ database: process.env.DATABASE_URL });
 * await mailroom.migrate();
 */
export async function createMailroom(options: MailroomOptions = {}): Promise<Mailroom> {
  return openMailroom(options, (poolSize, stallCheck) => connect(options.database as DatabaseOption | undefined, poolSize, stallCheck));
}

/**
 * Warns (a process warning) about a handler whose name no job defined in this process has, when a
 * defined job of the worker's queues is named nearly the same: most likely a typo, and that job's
 * runs would be dead-lettered as `unknown-type` by this worker.
 */
function warnMisnamedHandlers(options: WorkerOptions): void {
  const queues = new Set(options.queues ?? ['default']);
  const served = [...registeredJobs()].filter((def) => queues.has(def.queue)).map((def) => def.name);
  for (const name of Object.keys(options.handlers)) {
    if (findJob(name) !== undefined) continue;
    const guess = closest(name, served.filter((candidate) => !Object.hasOwn(options.handlers, candidate)));
    if (guess === undefined) continue;
    process.emitWarning(
      `worker: no job type "${name}" is defined in this process; did you mean "${guess}"? This worker has no handler for "${guess}" (queue ${findJob(guess)!.queue}), so its jobs would be dead-lettered as unknown-type`,
      { code: 'MAILROOM_HANDLER_NAME' },
    );
  }
}

const MAILROOM_OPTION_NAMES: OptionNames<MailroomOptions> = {
  database: true, schema: true, maxPayloadBytes: true, poolSize: true, rescueInterval: true, retention: true,
  source: true, queues: true, redact: true, logger: true, metrics: true, stallCheck: true,
};

/** createMailroom's checks, then a mailroom on the driver `open` gives (mailroom/testing opens an in-memory database). */
export async function openMailroom(options: MailroomOptions, open: (poolSize: number, stallCheck: StallCheck) => Promise<Driver>): Promise<Mailroom> {
  checkOptionNames(options, MAILROOM_OPTION_NAMES, 'createMailroom');
  quoteSchema(options.schema ?? 'mailroom');
  if (options.maxPayloadBytes !== undefined && (!Number.isInteger(options.maxPayloadBytes) || options.maxPayloadBytes < 1)) {
    throw new ValidationError('maxPayloadBytes must be a positive integer', [{ path: 'maxPayloadBytes', message: 'invalid' }]);
  }
  const poolSize = options.poolSize ?? 20;
  if (!Number.isInteger(poolSize) || poolSize < 2) throw new ValidationError('poolSize must be an integer of 2 or more', [{ path: 'poolSize', message: 'invalid' }]);
  checkRetentionAgainst(resolveRetention(options.retention), registeredJobs());
  checkMetricsOptions(options.metrics);
  if (options.source !== undefined) assertSource(options.source, 'source');
  // Every option is checked before anything is opened: a mistake must not leave a pool or an
  // embedded database (./.mailroom) behind.
  toMilliseconds(options.rescueInterval ?? '5s', 'rescueInterval');
  checkRedactPaths(options.redact);
  if (options.logger !== undefined) checkLogger(options.logger);
  checkQueueSettings(options.queues);
  const stallCheck = resolveStallCheck(options.stallCheck);
  return new Mailroom(await open(poolSize, stallCheck), options);
}
