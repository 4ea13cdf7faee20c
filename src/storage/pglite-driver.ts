import type { PGlite } from '@electric-sql/pglite';
import type { Driver, NamedQuery, QueryResult, Transaction } from './driver.ts';

/**
 * Driver over an embedded PGlite database. PGlite serves one connection, so
 * statements run one after another; the SQL is the same as on a server.
 */
export class PgliteDriver implements Driver {
  readonly kind = 'pglite' as const;

  constructor(
    private readonly db: PGlite,
    private readonly ownsDb: boolean,
  ) {}

  async query<R>(sql: string, params: readonly unknown[] = []): Promise<QueryResult<R>> {
    const result = await this.db.query<R>(sql, params as unknown[]);
    return { rows: result.rows, rowCount: result.affectedRows ?? result.rows.length };
  }

  run<R>(query: NamedQuery, params: readonly unknown[]): Promise<QueryResult<R>> {
    return this.query<R>(query.text, params);
  }

  transaction<T>(fn: (tx: Transaction) => Promise<T>): Promise<T> {
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
