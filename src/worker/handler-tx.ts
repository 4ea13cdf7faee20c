import { MailroomError } from '../errors.ts';
import type { JobQueries } from '../jobs/queries.ts';
import type { Driver, NamedQuery, Queryable, QueryResult, Transaction } from '../storage/driver.ts';

type Finish = (tx: Transaction) => Promise<boolean>;

/** The handler transaction behind each `ctx.tx` handle, for mailroom's own statements in it (the consumer's inbox). */
const byHandle = new WeakMap<Queryable, HandlerTransaction>();

/**
 * Runs one of mailroom's named statements in the transaction behind a
 * handler's `ctx.tx` (prepared once per connection, unlike the handler's own
 * text queries). Falls back to a text query for any other handle.
 */
export function runInHandlerTx<R>(handle: Queryable, query: NamedQuery, params: readonly unknown[]): Promise<QueryResult<R>> {
  const tx = byHandle.get(handle);
  return tx ? tx.run<R>(query, params) : handle.query<R>(query.text, params);
}

/**
 * The transaction behind `ctx.tx`: opened on the handler's first query, it
 * stays open while the handler runs and commits only together with the job's
 * fenced state change (completion or snooze). If this worker no longer owns
 * the job, or the handler fails, everything the handler wrote rolls back.
 *
 * On PostgreSQL the transaction carries `idle_in_transaction_session_timeout`
 * equal to the lease, so a worker paused (SIGSTOP) with the transaction open
 * cannot hold row locks past its lease: the server ends that session.
 */
export class HandlerTransaction {
  private opening: Promise<Transaction> | undefined;
  private settle: ((finish: Finish | null) => void) | undefined;
  private outcome: Promise<boolean> | undefined;
  private closed = false;
  readonly queryable: Queryable;

  constructor(
    private readonly driver: Driver,
    private readonly jobLabel: string,
    private readonly leaseMs: number,
    /** Its `txPrelude`, when set, runs first in the transaction (read when the transaction opens). */
    private readonly hooks?: { readonly txPrelude: ((tx: Transaction) => Promise<void>) | undefined },
  ) {
    this.queryable = {
      query: <R>(sql: string, params?: readonly unknown[]): Promise<QueryResult<R>> => this.query<R>(sql, params),
    };
    byHandle.set(this.queryable, this);
  }

  /** Runs a named statement in the transaction (opening it on first use), like a handler's query. */
  async run<R>(query: NamedQuery, params: readonly unknown[]): Promise<QueryResult<R>> {
    if (this.closed) throw new MailroomError(`ctx.tx of job ${this.jobLabel} was used after its handler returned`);
    const tx = await this.open();
    return tx.run<R>(query, params);
  }

  /** True once the handler has run a statement through `ctx.tx`. */
  get isOpen(): boolean {
    return this.opening !== undefined;
  }

  private async query<R>(sql: string, params?: readonly unknown[]): Promise<QueryResult<R>> {
    if (this.closed) {
      throw new MailroomError(
        `ctx.tx of job ${this.jobLabel} was used after its handler returned; await every ctx.tx query before returning from the handler`,
      );
    }
    const tx = await this.open();
    return tx.query<R>(sql, params);
  }

  private open(): Promise<Transaction> {
    this.opening ??= new Promise<Transaction>((resolveTx, rejectTx) => {
      this.outcome = this.driver.transaction(async (tx) => {
        const prelude = this.hooks?.txPrelude;
        if (prelude) await prelude(tx); // a failure here rolls back and rejects the handler's first query
        resolveTx(tx);
        const finish = await new Promise<Finish | null>((resolve) => (this.settle = resolve));
        if (finish === null) throw new RollbackSignal();
        if (!(await finish(tx))) throw new RollbackSignal();
        return true;
      }, { idleTimeoutMs: Math.max(1, Math.ceil(this.leaseMs)) });
      this.outcome.catch((error: unknown) => {
        rejectTx(error);
        return false;
      });
    });
    return this.opening;
  }

  /**
   * Runs the fenced state change in the transaction and commits. Resolves true
   * when committed; false when the fence refused (job no longer ours) and all
   * was rolled back. Throws when the commit itself failed.
   */
  async commitWith(finish: Finish): Promise<boolean> {
    this.closed = true;
    if (!this.opening) throw new Error('commitWith on a transaction that was never opened');
    await this.opening;
    this.settle?.(finish);
    try {
      return await this.outcome!;
    } catch (error) {
      if (error instanceof RollbackSignal) return false;
      throw error;
    }
  }

  /** Rolls back whatever the handler wrote (the handler failed or was abandoned). */
  async rollback(): Promise<void> {
    this.closed = true;
    if (!this.opening) return;
    try {
      await this.opening;
    } catch {
      return; // never opened: nothing to roll back
    }
    this.settle?.(null);
    await this.outcome?.catch(() => undefined);
  }
}

class RollbackSignal extends Error {
  constructor() {
    super('rolled back');
  }
}

/** The fenced cancel (a handler returned `cancel(reason)`), inside the handler's transaction. */
export function cancelInTransaction(queries: JobQueries, id: string, claim: number, reason: string): Finish {
  return async (tx) => (await tx.run(queries.cancelRun, [id, claim, reason])).rowCount === 1;
}

/** The fenced completion, inside the handler's transaction. */
export function completeInTransaction(queries: JobQueries, id: string, claim: number): Finish {
  return async (tx) => (await tx.run(queries.completeOne, [id, claim])).rowCount === 1;
}

/**
 * The fenced reschedule (snooze), inside the handler's transaction; `onDead` is called when the
 * job was dead-lettered instead, as waiting that long would take it past its maxAge.
 */
export function rescheduleInTransaction(queries: JobQueries, id: string, claim: number, delayMs: number, message: string, onDead: () => void): Finish {
  return async (tx) => {
    const { rows } = await tx.run<{ state: string }>(queries.reschedule, [id, claim, delayMs, null, message]);
    if (rows[0]?.state === 'dead') onDead();
    return rows.length === 1;
  };
}
