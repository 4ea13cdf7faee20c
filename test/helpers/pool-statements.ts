/**
 * A look at every named statement mailroom sends through a pool. mailroom's
 * driver runs its statements on checked-out clients, not through `pool.query`,
 * so a test that wants to count or hold them wraps each connection the pool
 * hands out.
 */
import type pg from 'pg';

/**
 * Calls `before(name)` ahead of each named statement sent on any of `pool`'s connections; when it
 * returns a promise, the statement waits for it.
 *
 * @example
 * let claims = 0;
 * beforeEachStatement(pool, (name) => void (name.startsWith('mailroom_claim_') && claims++));
 */
export function beforeEachStatement(pool: pg.Pool, before: (name: string) => void | Promise<void>): void {
  const wrapped = new WeakSet<pg.PoolClient>();
  pool.on('acquire', (client) => {
    if (wrapped.has(client)) return;
    wrapped.add(client);
    const query = client.query.bind(client) as (...args: unknown[]) => unknown;
    (client as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
      const config = args[0] as { name?: string } | string | undefined;
      const waiting = typeof config === 'object' && config?.name !== undefined ? before(config.name) : undefined;
      return waiting ? waiting.then(() => query(...args)) : query(...args);
    };
  });
}
