import type { Driver, NamedQuery, QueryResult, StatementOptions, Transaction, TransactionOptions } from './driver.ts';

/**
 * `driver` with `signal` on every statement and transaction run through it:
 * once `signal` aborts, what is in flight is cancelled (see
 * {@link StatementOptions.signal} and {@link TransactionOptions.signal}) and
 * nothing more runs. A statement's own signal still counts beside it.
 *
 * @example
 * const rounds = abortableDriver(driver, halt.signal); // halt.abort() ends every round's statements
 */
export function abortableDriver(driver: Driver, signal: AbortSignal): Driver {
  const withSignal = (options?: StatementOptions): StatementOptions => ({ signal: options?.signal ? AbortSignal.any([signal, options.signal]) : signal });
  return {
    kind: driver.kind,
    location: driver.location,
    query<R>(sql: string, params?: readonly unknown[], options?: StatementOptions): Promise<QueryResult<R>> {
      return driver.query<R>(sql, params, withSignal(options));
    },
    run<R>(query: NamedQuery, params: readonly unknown[], options?: StatementOptions): Promise<QueryResult<R>> {
      return driver.run<R>(query, params, withSignal(options));
    },
    transaction<T>(fn: (tx: Transaction) => Promise<T>, options?: TransactionOptions): Promise<T> {
      return driver.transaction(fn, { ...options, signal: options?.signal ? AbortSignal.any([signal, options.signal]) : signal });
    },
    listen: (channel, onNotify) => driver.listen(channel, onNotify),
    close: () => driver.close(),
  };
}
