import type { PGlite } from '@electric-sql/pglite';
import type { Driver, NamedQuery, QueryResult, StatementOptions, Transaction, TransactionOptions } from './driver.ts';
import { unlessAborted } from '../time-limit.ts';

/** How long a statement may wait behind an open transaction before the driver says why it may never run. */
const WAIT_WARNING_MS = 3000;

/**
 * Driver over an embedded PGlite database. PGlite serves one connection, so
 * statements run one after another; the SQL is the same as on a server.
 * A statement issued inside `mailroom.transaction(fn)` without `{ tx }` waits
 * for the transaction, which waits for it: after a few seconds of waiting the
 * driver emits a process warning (once) that says so.
 */
export class PgliteDriver implements Driver {
  readonly kind = 'pglite' as const;
  /** Transactions begun or waiting to begin. */
  private transactions = 0;
  private warnedWait = false;

  constructor(
    private readonly db: PGlite,
    private readonly ownsDb: boolean,
  ) {}

  async query<R>(sql: string, params: readonly unknown[] = [], options: StatementOptions = {}): Promise<QueryResult<R>> {
    // One connection: a statement that has begun cannot be cancelled, one aborted before it is not run.
    options.signal?.throwIfAborted();
    const waiting = this.transactions > 0 && !this.warnedWait ? setTimeout(() => this.warnWait(), WAIT_WARNING_MS) : undefined;
    waiting?.unref();
    try {
      const result = await this.db.query<R>(sql, params as unknown[]);
      return { rows: result.rows, rowCount: result.affectedRows ?? result.rows.length };
    } finally {
      clearTimeout(waiting);
    }
  }

  private warnWait(): void {
    if (this.warnedWait) return;
    this.warnedWait = true;
    process.emitWarning(
      `a statement has waited ${WAIT_WARNING_MS / 1000} s for the embedded database (PGlite serves one connection) behind an open transaction. ` +
        'If it was issued inside mailroom.transaction(fn) without { tx } (enqueue, publish, a query on the mailroom), it waits for the transaction, ' +
        'which waits for it, for good: pass { tx } to everything inside the transaction.',
      { code: 'MAILROOM_PGLITE_WAIT' },
    );
  }

  run<R>(query: NamedQuery, params: readonly unknown[], options?: StatementOptions): Promise<QueryResult<R>> {
    return this.query<R>(query.text, params, options);
  }

  async transaction<T>(fn: (tx: Transaction) => Promise<T>, options: TransactionOptions = {}): Promise<T> {
    const { signal } = options;
    signal?.throwIfAborted();
    this.transactions++;
    try {
      // Aborted: the callback rejects, and PGlite rolls back once a statement that has begun ends.
      return await this.inTransaction(signal ? (tx) => unlessAborted(fn(tx), signal) : fn);
    } finally {
      this.transactions--;
    }
  }

  private inTransaction<T>(fn: (tx: Transaction) => Promise<T>): Promise<T> {
    return this.db.transaction(async (raw) => {
      const tx: Transaction = {
        async query<R>(sql: string, params: readonly unknown[] = []): Promise<QueryResult<R>> {
          const result = await raw.query<R>(sql, params as unknown[]);
          return { rows: result.rows, rowCount: result.affectedRows ?? result.rows.length };
        },
        async run<R>(query: NamedQuery, params: readonly unknown[]): Promise<QueryResult<R>> {
          const result = await raw.query<R>(query.text, params as unknown[]);
          return { rows: result.rows, rowCount: result.affectedRows ?? result.rows.length };
        },
        async exec(script: string): Promise<void> {
          await raw.exec(script);
        },
      };
      return fn(tx);
    });
  }

  async listen(channel: string, onNotify: (payload: string) => void): Promise<() => Promise<void>> {
    return this.db.listen(`"${channel}"`, onNotify);
  }

  async close(): Promise<void> {
    if (this.ownsDb && !this.db.closed) await this.db.close();
  }
}
