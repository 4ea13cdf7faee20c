import pg from 'pg';
import { MailroomError } from '../errors.ts';
import { within } from '../time-limit.ts';

/**
 * When a statement counts as unanswered, how often unanswered ones are looked
 * at, and how long the look may take (connecting included).
 */
export interface StallCheck {
  /** A statement outstanding this long is looked at. */
  afterMs: number;
  /** How often the outstanding statements are gone through. */
  everyMs: number;
  /** The look's own time limit: without an answer, nothing is decided. */
  answerMs: number;
}

export const STALL_CHECK: StallCheck = { afterMs: 15_000, everyMs: 5_000, answerMs: 10_000 };

/** The longest gap between two looks at a statement the server was running each time. */
const MAX_LOOK_GAP_MS = 60_000;

/** How the looks' connections name themselves (`pg_stat_activity.application_name`, connection logs). */
const STALL_CHECK_APPLICATION = 'mailroom stall check';

/** Which server process a pooled connection talks to (from the server itself, once per connection). */
interface Backend {
  pid: number;
  /** `backend_start` (µs since the epoch, as text): with the pid, no other process on this or another server has it. */
  started: string;
  /** False behind a pooler (PgBouncer): the pid is of the server process that answered, not necessarily the next one. */
  direct: boolean;
}

/** A statement outstanding on a pooled connection. */
export interface Outstanding {
  client: pg.PoolClient;
  since: number;
  /** When to look at it next: `afterMs` after it was sent, then further apart while the server runs it. */
  lookAt: number;
  /** When a look first found its server process blocked writing to the connection (ClientWrite), until one finds it not. */
  writingSince?: number;
}

/** What the server said about one of the processes asked after. */
interface Seen {
  pid: number;
  started: string;
  state: string | null;
  wait_event: string | null;
  idle_ms: number | null;
}

// backend_start in microseconds since the epoch, as text: the same whatever the session's time zone.
const STARTED = `(extract(epoch FROM backend_start) * 1000000)::bigint::text`;
const BACKEND_SQL = `SELECT pid, ${STARTED} AS started FROM pg_stat_activity WHERE pid = pg_backend_pid()`;
// $1 pids. A role sees other sessions' state only for its own role (or with pg_read_all_stats): a
// state it may not see is null, and decides nothing.
const LOOK_SQL = `SELECT pid, ${STARTED} AS started, state, wait_event,
                         (extract(epoch FROM clock_timestamp() - state_change) * 1000)::float8 AS idle_ms
                    FROM pg_stat_activity WHERE pid = ANY($1::int[])`;
// $1 pid, $2 started. Ends a process given up on (its transaction's locks with it), if it is still that process.
const TERMINATE_SQL = `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND ${STARTED} = $2`;
const IDLE_STATES = new Set(['idle', 'idle in transaction', 'idle in transaction (aborted)']);

/** A statement given up on: the server no longer runs it, and its connection was closed. */
export class StalledConnectionError extends MailroomError {
  override name = 'StalledConnectionError';
}

/**
 * Finds pooled connections that stopped answering without being closed (a
 * failover to another host, a partition or a NAT that dropped the connection's
 * state), which the operating system would otherwise keep for about 15 minutes
 * while every statement on them waits. A statement unanswered for
 * `afterMs` is looked up from a fresh connection: when the server no longer
 * has the connection's process, or that process sits idle (it never got the
 * statement, or its answer was lost), or two looks found it blocked writing
 * the answer (nothing reads the other end), the connection is closed and the
 * statement rejects with {@link StalledConnectionError}; its caller retries as
 * after any lost connection. A server process still there is then ended
 * (`pg_terminate_backend`), so that its transaction's locks go with it. A
 * statement the server is still running (a long one, one waiting for a lock)
 * is left alone. Idle pooled connections whose process is gone are dropped
 * when next checked out.
 *
 * Behind a pooler that hands out its own process ids (PgBouncer), the process
 * a connection talks to is not known, and its statements are not looked at.
 *
 * @example
 * const stalls = new StalledStatements(pool, STALL_CHECK);
 * const client = await stalls.checkout();
 * try { await stalls.track(client, client.query('SELECT 1')); } finally { client.release(); }
 */
export class StalledStatements {
  /** Each identified client's process, and how to stop hearing of its end (at {@link stop}: a pool passed in outlives this driver). */
  private readonly backends = new Map<pg.PoolClient, Backend & { unwatch: () => void }>();
  private readonly outstanding = new Set<Outstanding>();
  private readonly gone = new WeakSet<pg.PoolClient>();
  private readonly closedFor = new WeakMap<pg.PoolClient, string>();
  private timer: NodeJS.Timeout | undefined;
  private looking = false;
  private stopped = false;

  constructor(
    private readonly pool: pg.Pool,
    private readonly check: StallCheck = STALL_CHECK,
  ) {}

  /** A client from the pool whose process is not known to be gone, its process looked up once. */
  async checkout(): Promise<pg.PoolClient> {
    for (;;) {
      const client = await this.pool.connect();
      if (this.gone.has(client)) {
        client.release(true);
        continue;
      }
      if (!this.backends.has(client)) {
        // A connection cut off before its first statement must not hold the caller: given up after answerMs.
        type Outcome = 'ok' | 'no answer' | { error: unknown };
        const outcome = await within<Outcome>(this.identify(client).then(() => 'ok', (error: unknown) => ({ error })), this.check.answerMs, 'no answer');
        if (outcome !== 'ok') {
          client.release(true);
          if (outcome !== 'no answer') throw outcome.error;
          throw new StalledConnectionError(`PostgreSQL did not answer a pooled connection's first statement within ${this.check.answerMs} ms; the connection was closed. Check that the server is up and reachable.`);
        }
      }
      return client;
    }
  }

  /** The server process of a client from {@link checkout} (for `pg_cancel_backend`). */
  serverPid(client: pg.PoolClient): number | undefined {
    return this.backends.get(client)?.pid;
  }

  /** `statement` (running on `client`), watched while it is outstanding; rejects with {@link StalledConnectionError} if given up on. */
  async track<T>(client: pg.PoolClient, statement: Promise<T>): Promise<T> {
    const entry = this.watch(client);
    try {
      return await statement;
    } catch (error) {
      throw this.failure(client, error);
    } finally {
      this.outstanding.delete(entry);
    }
  }

  /** Watches a statement about to be sent on `client` until `settled(entry)` (what {@link track} does, for a hot path without its extra promise). */
  watch(client: pg.PoolClient): Outstanding {
    const since = Date.now();
    const entry: Outstanding = { client, since, lookAt: since + this.check.afterMs };
    this.outstanding.add(entry);
    this.timer ??= this.start();
    return entry;
  }

  settled(entry: Outstanding): void {
    this.outstanding.delete(entry);
  }

  /** The error a statement on `client` failed with, or a {@link StalledConnectionError} if its connection was given up on. */
  failure(client: pg.PoolClient, error: unknown): unknown {
    const why = this.closedFor.get(client);
    return why === undefined ? error : new StalledConnectionError(why, { cause: error });
  }

  /** Stops looking (the driver is closing), and lets go of the pool's clients. */
  stop(): void {
    this.stopped = true;
    clearInterval(this.timer);
    for (const { unwatch } of this.backends.values()) unwatch();
  }

  private start(): NodeJS.Timeout {
    const timer = setInterval(() => void this.sweep(), this.check.everyMs);
    timer.unref();
    return timer;
  }

  private async identify(client: pg.PoolClient): Promise<void> {
    const { rows } = await client.query<Omit<Backend, 'direct'>>(BACKEND_SQL);
    const backend = rows[0]!;
    // A pooler (PgBouncer) gives its own process id in the startup reply: the server's is another.
    const unwatch = whenEnded(client, () => this.backends.delete(client));
    this.backends.set(client, { ...backend, direct: backend.pid === (client as unknown as { processID: number | null }).processID, unwatch });
  }

  private async sweep(): Promise<void> {
    if (this.looking || this.stopped) return;
    const now = Date.now();
    const stalled = [...this.outstanding].filter((o) => now >= o.lookAt && this.backends.get(o.client)?.direct);
    if (stalled.length === 0) return;
    this.looking = true;
    try {
      const seen = await this.look();
      // A statement answered while the look ran is left alone: under load (a starved event loop, a slow
      // network) its answer often arrives meanwhile, and its connection may already carry the next one.
      const unanswered = stalled.filter((entry) => this.outstanding.has(entry));
      const ending = seen ? this.decide(seen, unanswered, Date.now()) : [];
      if (ending.length > 0) await this.terminate(ending);
    } finally {
      this.looking = false;
    }
  }

  /**
   * The server's view of every known connection's process, from a connection of its own; undefined
   * without an answer in time. Only the processes asked after are in `asked`: a connection made while
   * the look ran is not.
   */
  private async look(): Promise<{ seen: Map<number, Seen>; asked: Set<number> } | undefined> {
    const asked = new Set([...this.backends.values()].flatMap((b) => (b.direct ? [b.pid] : [])));
    return this.probe(async (probe) => {
      const { rows } = await probe.query<Seen>(LOOK_SQL, [[...asked]]);
      return { seen: new Map(rows.map((r) => [r.pid, r])), asked };
    });
  }

  /**
   * Ends the server processes of connections given up on that the server still has (idle in their
   * transaction, or blocked writing to the connection): their transactions' locks would otherwise
   * be held until the server notices the connection is gone, hours later with default keepalives.
   * The probe connects as the pool's role, which may end its own processes; a refusal leaves them be.
   */
  private async terminate(backends: readonly Backend[]): Promise<void> {
    await this.probe(async (probe) => {
      for (const b of backends) await probe.query(TERMINATE_SQL, [b.pid, b.started]).catch(() => {});
    });
  }

  /** `fn` on a fresh connection of its own (named for the stall check), within `answerMs`; undefined without an answer in time or on an error. */
  private async probe<T>(fn: (client: pg.Client) => Promise<T>): Promise<T | undefined> {
    const Client = (this.pool as unknown as { Client?: typeof pg.Client }).Client ?? pg.Client;
    const probe = new Client({ ...(this.pool.options as pg.ClientConfig), application_name: STALL_CHECK_APPLICATION, connectionTimeoutMillis: this.check.answerMs });
    probe.on('error', () => {});
    const asked = (async () => {
      await probe.connect();
      return fn(probe);
    })().catch(() => undefined);
    try {
      return await within(asked, this.check.answerMs, undefined);
    } finally {
      void probe.end().catch(() => {});
    }
  }

  /** Gives up on the stalled statements whose connection is gone, idle or blocked writing; returns the server processes still there to end. */
  private decide({ seen, asked }: { seen: Map<number, Seen>; asked: Set<number> }, stalled: Outstanding[], now: number): Backend[] {
    const ending: Backend[] = [];
    for (const [client, backend] of this.backends) {
      if (!backend.direct || !asked.has(backend.pid)) continue;
      const row = seen.get(backend.pid);
      if (row === undefined || row.started !== backend.started) this.gone.add(client);
    }
    for (const entry of stalled) {
      const { client, since } = entry;
      const backend = this.backends.get(client);
      if (!backend?.direct || this.closedFor.has(client)) continue;
      const waited = now - since;
      // Left alone this time: looked at again after as long as it has waited (a long statement, or one
      // waiting for a lock, costs a connection now and then, not one every everyMs).
      entry.lookAt = now + Math.min(MAX_LOOK_GAP_MS, Math.max(this.check.everyMs, waited));
      const row = seen.get(backend.pid);
      const writing = row?.state === 'active' && row.wait_event === 'ClientWrite';
      let why: string | undefined;
      if (this.gone.has(client)) {
        why = `the server no longer has its process (${backend.pid})`;
      } else if (row?.state && IDLE_STATES.has(row.state) && row.idle_ms !== null && row.idle_ms >= waited / 2) {
        // Idle for at least half the wait: the statement never reached the server, or its answer was
        // lost (an answer on its way now left the process idle only for a moment).
        why = `its server process (${backend.pid}) has been ${row.state} for ${Math.round(row.idle_ms)} ms`;
      } else if (writing && entry.writingSince !== undefined) {
        // Blocked writing the answer at two looks: nothing reads the connection's other end any more
        // (a client reading a large answer keeps the process writing only for moments).
        why = `its server process (${backend.pid}) has been blocked writing the answer to the connection (ClientWrite) since a look ${now - entry.writingSince} ms earlier`;
      }
      entry.writingSince = writing ? (entry.writingSince ?? now) : undefined;
      if (why === undefined) continue;
      if (!this.gone.has(client)) ending.push(backend);
      this.closedFor.set(
        client,
        `PostgreSQL stopped answering a connection: a statement waited ${waited} ms and ${why}. The connection was closed ` +
          `(it was cut off without a reset: a failover to another host, a network partition, or a NAT or firewall that dropped it). ` +
          `The statement may have taken effect; mailroom retries its own statements, and a job whose completion was lost is run again after its lease.`,
      );
      this.gone.add(client);
      // With a statement in flight, end() closes the socket at once and fails the statement.
      void client.end().catch(() => {});
    }
    return ending;
  }
}

/** Who wants to hear of each pooled client's end, and the one `'end'` listener that tells them. */
const endWatchers = new WeakMap<pg.PoolClient, { watchers: Set<() => void>; listener: () => void }>();

/**
 * Calls `onEnd` when `client`'s connection ends; returns what stops that. Every
 * stall check on a shared pool watches each of its clients, so they share one
 * listener per client, taken off when the last stops watching (a listener each
 * passed node's limit of ten once more than ten mailrooms shared a pool, and
 * printed a leak warning).
 *
 * @example
 * const unwatch = whenEnded(client, () => backends.delete(client));
 * unwatch(); // at stop
 */
function whenEnded(client: pg.PoolClient, onEnd: () => void): () => void {
  let entry = endWatchers.get(client);
  if (entry === undefined) {
    const watchers = new Set<() => void>();
    const listener = () => {
      endWatchers.delete(client);
      for (const watcher of watchers) watcher();
    };
    entry = { watchers, listener };
    endWatchers.set(client, entry);
    client.once('end', listener);
  }
  const { watchers, listener } = entry;
  watchers.add(onEnd);
  return () => {
    watchers.delete(onEnd);
    if (watchers.size > 0 || endWatchers.get(client)?.listener !== listener) return;
    endWatchers.delete(client);
    client.off('end', listener);
  };
}
