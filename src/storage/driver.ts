/**
 * The one small seam between mailroom and a PostgreSQL driver. Both drivers
 * (node-postgres for a server, PGlite embedded) run the same SQL.
 */

/** Result of one statement. */
export interface QueryResult<R> {
  rows: R[];
  rowCount: number;
}

/** Something that runs a parameterised statement: a pool, a client or a transaction. */
export interface Queryable {
  query<R = Record<string, unknown>>(sql: string, params?: readonly unknown[]): Promise<QueryResult<R>>;
}

/** A transaction mailroom opened: statements, plus multi-statement scripts (migrations). */
export interface Transaction extends Queryable {
  /** Runs a named statement (prepared once per connection on node-postgres). */
  run<R = Record<string, unknown>>(query: NamedQuery, params: readonly unknown[]): Promise<QueryResult<R>>;
  exec(script: string): Promise<void>;
}

/**
 * Runs a named statement through `db`: prepared once per connection where `db`
 * can (a driver, or a transaction mailroom opened), sent as its text where it
 * cannot (a caller's transaction handle). Statements a transaction sends as
 * text are parsed and planned anew each time.
 *
 * @example
 * const { rowCount } = await runNamed(context.tx, queries.fanOut, params);
 */
export function runNamed<R = Record<string, unknown>>(db: Queryable, query: NamedQuery, params: readonly unknown[]): Promise<QueryResult<R>> {
  const run = (db as Partial<Transaction>).run;
  return typeof run === 'function' ? run.call(db, query, params) as Promise<QueryResult<R>> : db.query<R>(query.text, params);
}

/** A named statement that node-postgres prepares once per connection. */
export interface NamedQuery {
  name: string;
  text: string;
}

/** Options of {@link Driver.transaction}. */
export interface TransactionOptions {
  /** `idle_in_transaction_session_timeout` for this transaction, in whole milliseconds (PostgreSQL only). */
  idleTimeoutMs?: number;
  /**
   * `false`: no JIT compilation in this transaction (PostgreSQL only). For reports that read much
   * and run rarely (stats, dead-letter counts): PostgreSQL prices their per-row subqueries high
   * enough to compile them, which took longer than running them.
   */
  jit?: false;
  /**
   * Ends the transaction when aborted, from outside `fn`: the call rejects with the signal's reason
   * at once, even while `fn` awaits something else (a hung publish). On PostgreSQL a statement in
   * flight is cancelled on the server and the connection is closed, which rolls the transaction back;
   * every later statement of `fn` rejects. An abort once COMMIT was sent cancels the COMMIT too: one
   * the cancel makes fail rolls back and the call rejects with the reason; one waiting for a
   * synchronous standby returns committed on this server, and the call resolves. On PGlite the
   * transaction rolls back once a statement that has begun ends; a COMMIT is not cut short.
   */
  signal?: AbortSignal;
}

/** Options of one statement run by {@link Driver.run} or {@link Driver.query}. */
export interface StatementOptions {
  /**
   * Cancels the statement when aborted. On PostgreSQL a statement in flight is cancelled on the
   * server (`pg_cancel_backend`; it fails with SQLSTATE 57014 and its work is rolled back) and its
   * connection is closed rather than reused. PGlite cannot cancel a statement that has begun; one not
   * yet begun is not run. Either way the call rejects.
   */
  signal?: AbortSignal;
}

/** A connection to the database as mailroom uses it. */
export interface Driver extends Queryable {
  readonly kind: 'pg' | 'pglite';
  /** Where the database is, for error messages: a URL without its password. */
  readonly location?: string;
  /** Runs a statement outside any transaction (`signal`: see {@link StatementOptions}). */
  query<R = Record<string, unknown>>(sql: string, params?: readonly unknown[], options?: StatementOptions): Promise<QueryResult<R>>;
  /** Runs a prepared (named) statement outside any transaction (`signal`: see {@link StatementOptions}). */
  run<R = Record<string, unknown>>(query: NamedQuery, params: readonly unknown[], options?: StatementOptions): Promise<QueryResult<R>>;
  /**
   * Runs `fn` in a transaction; commits when it resolves, rolls back when it throws.
   * `idleTimeoutMs` (PostgreSQL): the server ends the session when the transaction sits idle that
   * long (a paused process cannot hold its locks forever); set in the same round trip as BEGIN.
   */
  transaction<T>(fn: (tx: Transaction) => Promise<T>, options?: TransactionOptions): Promise<T>;
  /** Calls `onNotify` for each NOTIFY on `channel`; resolves to an unsubscribe function. */
  listen(channel: string, onNotify: (payload: string) => void): Promise<() => Promise<void>>;
  /** Releases what this driver opened (not a pool or database the user passed in). */
  close(): Promise<void>;
}

/**
 * A transaction handle from the caller: a node-postgres client inside BEGIN, a
 * PGlite transaction, or the `tx` of `mailroom.transaction(fn)`.
 */
export interface TransactionLike {
  query(text: string, params?: unknown[]): Promise<unknown>;
}

interface RawResult {
  rows?: unknown[];
  rowCount?: number | null;
  affectedRows?: number;
}

/** Adapts a user's transaction handle (pg client or PGlite transaction) to {@link Queryable}. */
export function asQueryable(tx: TransactionLike): Queryable {
  if (typeof tx !== 'object' || tx === null || typeof (tx as { query?: unknown }).query !== 'function') {
    throw new TypeError(
      `tx must be a node-postgres client inside a transaction, a PGlite transaction, or the tx of mailroom.transaction(); got ${tx === null ? 'null' : typeof tx} (leave tx out to write outside a transaction)`,
    );
  }
  return {
    async query<R>(sql: string, params?: readonly unknown[]): Promise<QueryResult<R>> {
      const raw = (await tx.query(sql, params ? [...params] : [])) as RawResult;
      const rows = (raw.rows ?? []) as R[];
      return { rows, rowCount: raw.rowCount ?? raw.affectedRows ?? rows.length };
    },
  };
}
