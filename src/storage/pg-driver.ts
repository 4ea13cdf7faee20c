import pg from 'pg';
import type { Driver, NamedQuery, QueryResult, StatementOptions, Transaction, TransactionOptions } from './driver.ts';
import { CANCEL_WAIT_MS, unlessAborted, within } from '../time-limit.ts';
import { STALL_CHECK, StalledStatements, type StallCheck } from './stalled-statements.ts';

const RECONNECT_DELAY_MS = 1000;
const ignore = (): void => {};
/** SQLSTATE of a statement cancelled by `pg_cancel_backend`. */
const QUERY_CANCELED = '57014';

/**
 * How often the LISTEN connection is asked a `SELECT 1`, and how long it may
 * take to answer before it is taken for dead and replaced. A connection cut
 * off without a reset (a network partition, a NAT or failover dropping its
 * state) otherwise looks alive for good, and no NOTIFY reaches it.
 */
export interface ListenCheck {
  everyMs: number;
  answerMs: number;
}

const LISTEN_CHECK: ListenCheck = { everyMs: 30_000, answerMs: 10_000 };

/**
 * Driver over a node-postgres pool. Hot statements are sent as named
 * (prepared) statements; LISTEN holds one dedicated client, reconnecting after
 * a lost connection (a notification is only a hint, so one missed is harmless)
 * and after one that stopped answering (see {@link ListenCheck}).
 */
export class PgDriver implements Driver {
  readonly kind = 'pg' as const;
  readonly location: string;
  private readonly listeners = new Map<string, Set<(payload: string) => void>>();
  private listenClient: pg.PoolClient | undefined;
  /** Removes the LISTEN connection's own event handlers (before it goes back to the pool). */
  private detachListenClient: (() => void) | undefined;
  private listenConnecting: Promise<void> | undefined;
  private closed = false;
  private readonly stalls: StalledStatements;

  constructor(
    private readonly pool: pg.Pool,
    private readonly ownsPool: boolean,
    private readonly listenCheck: ListenCheck = LISTEN_CHECK,
    stallCheck: StallCheck = STALL_CHECK,
  ) {
    this.location = poolLocation(pool);
    this.stalls = new StalledStatements(pool, stallCheck);
    if (ownsPool) {
      // An idle client losing its connection (server restart, terminated backend)
      // must not crash the process; the pool replaces it on next use.
      pool.on('error', () => {});
      // A new connection is handed over from inside node-postgres' message loop, and `await pool.connect()`
      // resumes only after that loop: if the same read also carries the session's end (FATAL 57P01 from
      // pg_terminate_backend or a restart), the 'error' event would find no listener and crash the
      // process. Errors of a checked-out client surface on its next query instead.
      pool.on('connect', (client) => client.on('error', () => {}));
    }
  }

  async query<R>(sql: string, params: readonly unknown[] = [], options: StatementOptions = {}): Promise<QueryResult<R>> {
    const config = { text: sql, values: params as unknown[] };
    const result = options.signal ? await this.cancellable(config, options.signal) : await this.statement(config);
    return { rows: result.rows as R[], rowCount: result.rowCount ?? 0 };
  }

  async run<R>(query: NamedQuery, params: readonly unknown[], options: StatementOptions = {}): Promise<QueryResult<R>> {
    const config = { name: query.name, text: query.text, values: params as unknown[] };
    const result = options.signal ? await this.cancellable(config, options.signal) : await this.statement(config);
    return { rows: result.rows as R[], rowCount: result.rowCount ?? 0 };
  }

  /**
   * Runs one statement on a pooled client, as `pool.query` does (a client whose statement failed is
   * closed), watched for a connection that stopped answering (see {@link StalledStatements}).
   */
  private async statement(config: pg.QueryConfig): Promise<pg.QueryResult> {
    const client = await this.stalls.checkout();
    // A checked-out client has no 'error' listener of the pool's: its socket failing must not crash the process.
    client.on('error', ignore);
    const watched = this.stalls.watch(client);
    let failed = false;
    try {
      return await client.query(config);
    } catch (error) {
      failed = true;
      throw this.stalls.failure(client, error);
    } finally {
      this.stalls.settled(watched);
      client.off('error', ignore);
      client.release(failed);
    }
  }

  /**
   * Runs one statement on a client of its own, cancelled on the server when `signal` aborts (from
   * another connection: this one is busy). A client a cancel was sent for is closed, not reused: the
   * request may arrive after the statement ended, and must not cancel the next caller's.
   */
  private async cancellable(config: pg.QueryConfig, signal: AbortSignal): Promise<pg.QueryResult> {
    signal.throwIfAborted();
    const client = await this.stalls.checkout();
    let onAbort: (() => void) | undefined;
    let failed = false;
    try {
      const pid = this.stalls.serverPid(client);
      signal.throwIfAborted();
      // The statement may have ended meanwhile, or the server be gone: then there is nothing to cancel.
      onAbort = () => void this.pool.query('SELECT pg_cancel_backend($1)', [pid]).catch(() => {});
      signal.addEventListener('abort', onAbort, { once: true });
      return await this.stalls.track(client, client.query(config));
    } catch (error) {
      failed = true;
      // A statement cancelled for the signal rejects with the signal's reason (it says why), not 57014.
      if (signal.aborted) throw signal.reason;
      throw error;
    } finally {
      if (onAbort) signal.removeEventListener('abort', onAbort);
      // Aborted: a cancel request may be on its way.
      client.release(failed || signal.aborted);
    }
  }

  async transaction<T>(fn: (tx: Transaction) => Promise<T>, options: TransactionOptions = {}): Promise<T> {
    const { signal } = options;
    signal?.throwIfAborted();
    const begin = beginStatement(options);
    const client = await this.stalls.checkout();
    let inFlight = 0;
    /** The statement sent last: an abort waits for it to end on the server (its lock wait with it). */
    let sent: Promise<unknown> = Promise.resolve();
    let committing = false;
    let released = false;
    const release = (destroy: boolean) => {
      if (released) return;
      released = true;
      client.release(destroy);
    };
    const send = async <R extends pg.QueryResultRow>(config: string | pg.QueryConfig): Promise<pg.QueryResult<R>> => {
      if (signal?.aborted && !committing) throw signal.reason;
      inFlight++;
      try {
        const result = this.stalls.track(client, client.query<R>(config));
        sent = result;
        return await result;
      } finally {
        inFlight--;
      }
    };
    let broken = false;
    // A checked-out client has no 'error' listener (the pool removes its own): if the server ends the
    // session mid-transaction (restart, terminated backend, idle_in_transaction_session_timeout), the
    // unhandled 'error' event would crash the process. The failure surfaces on the next query instead.
    const onError = () => {
      broken = true;
    };
    client.on('error', onError);
    // Aborted before COMMIT: the statement in flight is cancelled (it may wait for a lock, which a
    // closed socket does not end); once it ended, the connection is closed, which rolls the
    // transaction back (see the catch below). Aborted during COMMIT: the COMMIT is cancelled too. One
    // waiting for a synchronous standby that does not answer then returns: committed on this server,
    // with PostgreSQL's warning that the standby may not have it. Either way the connection is closed,
    // not reused: the cancel request may arrive after the statement ended.
    let cancelSent = false;
    const onAbort = () => {
      const pid = this.stalls.serverPid(client);
      if (inFlight > 0 && pid !== undefined) {
        cancelSent = true;
        void this.pool.query('SELECT pg_cancel_backend($1)', [pid]).catch(() => {});
      }
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      await send(begin);
      const tx: Transaction = {
        async query<R>(sql: string, params: readonly unknown[] = []): Promise<QueryResult<R>> {
          const result = await send({ text: sql, values: params as unknown[] });
          return { rows: result.rows as R[], rowCount: result.rowCount ?? 0 };
        },
        async run<R>(query: NamedQuery, params: readonly unknown[]): Promise<QueryResult<R>> {
          const result = await send({ name: query.name, text: query.text, values: params as unknown[] });
          return { rows: result.rows as R[], rowCount: result.rowCount ?? 0 };
        },
        async exec(script: string): Promise<void> {
          await send(script);
        },
      };
      const value = signal ? await unlessAborted(fn(tx), signal) : await fn(tx);
      committing = !signal?.aborted;
      await send('COMMIT');
      return value;
    } catch (err) {
      // Cut short before COMMIT, or a COMMIT that the cancel made fail (57014: rolled back): the signal's reason.
      // A COMMIT that failed otherwise (its connection lost) may have committed: its own error says so.
      if (signal?.aborted && (!committing || (cancelSent && (err as { code?: unknown } | null)?.code === QUERY_CANCELED))) {
        // The transaction rejects only once its cancelled statement ended on the server (or the wait ran out):
        // a stop that then resolves leaves nothing of it waiting for a lock.
        if (inFlight > 0) await within(sent.then(ignore, ignore), CANCEL_WAIT_MS, undefined);
        client.off('error', onError);
        client.on('error', ignore);
        release(true);
        throw signal.reason;
      }
      try {
        await send('ROLLBACK');
      } catch {
        broken = true;
      }
      throw err;
    } finally {
      signal?.removeEventListener('abort', onAbort);
      client.off('error', onError);
      release(broken || cancelSent);
    }
  }

  async listen(channel: string, onNotify: (payload: string) => void): Promise<() => Promise<void>> {
    let set = this.listeners.get(channel);
    if (!set) {
      set = new Set();
      this.listeners.set(channel, set);
      if (this.listenClient) await this.listenClient.query(`LISTEN "${channel}"`);
    }
    set.add(onNotify);
    await this.ensureListenClient();
    return async () => {
      const current = this.listeners.get(channel);
      current?.delete(onNotify);
      if (current && current.size === 0) {
        this.listeners.delete(channel);
        if (this.listeners.size === 0) await this.releaseListenClient();
        else await this.listenClient?.query(`UNLISTEN "${channel}"`).catch(() => {});
      }
    };
  }

  /**
   * Nobody listens any more (every worker and relay stopped): the LISTEN connection goes back to
   * the pool instead of staying pinned until close(). The next listen() connects one again.
   */
  private async releaseListenClient(): Promise<void> {
    const client = this.listenClient;
    const detach = this.detachListenClient;
    if (!client) return;
    this.listenClient = undefined;
    this.detachListenClient = undefined;
    // A connection that stopped answering must not hold up a stop: given up after the check's wait.
    const unlistened = await answersWithin(client.query('UNLISTEN *'), this.listenCheck.answerMs);
    detach?.();
    if (!unlistened) client.on('error', () => {}); // destroyed below: a late 'error' must find a listener
    client.release(!unlistened);
  }

  private ensureListenClient(): Promise<void> {
    if (this.listenClient || this.closed) return Promise.resolve();
    this.listenConnecting ??= this.connectListenClient().finally(() => {
      this.listenConnecting = undefined;
    });
    return this.listenConnecting;
  }

  private async connectListenClient(): Promise<void> {
    const client = await this.pool.connect();
    const onNotification = (msg: pg.Notification) => {
      for (const fn of this.listeners.get(msg.channel) ?? []) fn(msg.payload ?? '');
    };
    let check: NodeJS.Timeout | undefined;
    const onLost = () => {
      if (this.listenClient !== client) return;
      this.listenClient = undefined;
      this.detachListenClient = undefined;
      // Its handlers stay: a destroyed client may still emit 'error', which must find a listener.
      clearInterval(check);
      client.release(true);
      if (!this.closed) setTimeout(() => void this.ensureListenClient().catch(() => this.scheduleRelisten()), RECONNECT_DELAY_MS).unref();
    };
    client.on('notification', onNotification);
    client.on('error', onLost);
    client.on('end', onLost);
    let checking = false;
    check = setInterval(() => {
      if (checking || this.listenClient !== client) return;
      checking = true;
      void answersWithin(client.query('SELECT 1'), this.listenCheck.answerMs).then((answered) => {
        checking = false;
        if (!answered) onLost();
      });
    }, this.listenCheck.everyMs);
    check.unref();
    const detach = () => {
      clearInterval(check);
      client.off('notification', onNotification);
      client.off('error', onLost);
      client.off('end', onLost);
    };
    try {
      for (const channel of this.listeners.keys()) await client.query(`LISTEN "${channel}"`);
    } catch (error) {
      detach();
      client.release(true);
      throw error;
    }
    if (this.listeners.size === 0 || this.closed) {
      // Everyone unsubscribed (or the driver closed) while this connection was being set up.
      await client.query('UNLISTEN *').catch(() => {});
      detach();
      client.release();
      return;
    }
    this.listenClient = client;
    this.detachListenClient = detach;
  }

  private scheduleRelisten(): void {
    if (!this.closed) setTimeout(() => void this.ensureListenClient().catch(() => this.scheduleRelisten()), RECONNECT_DELAY_MS).unref();
  }

  async close(): Promise<void> {
    this.closed = true;
    try {
      await this.releaseListenClient();
      // Watched until the pool has ended: ending waits for statements still out, stalled ones too.
      if (this.ownsPool) await this.pool.end();
    } finally {
      this.stalls.stop();
    }
  }
}

/**
 * BEGIN, with the transaction's settings (idle timeout, JIT off) set in the same round trip (a
 * simple-protocol script: one write and one reply instead of two). The timeout is a whole number of
 * milliseconds checked here, never text from outside.
 */
function beginStatement(options: TransactionOptions): string {
  const parts = ['BEGIN'];
  const ms = options.idleTimeoutMs;
  if (ms !== undefined) {
    if (!Number.isSafeInteger(ms) || ms < 1) throw new RangeError(`idleTimeoutMs must be a positive whole number of milliseconds, got ${String(ms)}`);
    parts.push(`SET LOCAL idle_in_transaction_session_timeout = ${ms}`);
  }
  if (options.jit === false) parts.push('SET LOCAL jit = off');
  return parts.join('; ');
}

/** The pool's server as a URL without the password: `postgres://user@host:port/database`. */
function poolLocation(pool: pg.Pool): string {
  const o = pool.options as pg.PoolConfig;
  if (typeof o.connectionString === 'string') {
    try {
      const url = new URL(o.connectionString);
      url.password = '';
      url.search = ''; // node-postgres also reads a password (and sslpassword) from the query string
      return url.toString();
    } catch {
      return 'the PostgreSQL server of the connection string';
    }
  }
  return `postgres://${o.user ?? process.env.PGUSER ?? ''}@${o.host ?? process.env.PGHOST ?? 'localhost'}:${o.port ?? process.env.PGPORT ?? 5432}/${o.database ?? process.env.PGDATABASE ?? ''}`;
}

/** Whether `statement` succeeded within `ms` (a failure or no answer in time: false; a late outcome is ignored). */
function answersWithin(statement: Promise<unknown>, ms: number): Promise<boolean> {
  return within(statement.then(() => true, () => false), ms, false);
}
