/**
 * Plan tests: a statement prepared in a session of its own and explained
 * under each plan mode, so that a test sees the custom plan a connection
 * makes first and the generic one it keeps later. PGlite serves one
 * connection, so these run on PostgreSQL only.
 */
import { it } from 'node:test';
import pg from 'pg';
import { databaseUrl, type TestDatabase, type TestMailroom } from './databases.ts';

export const PLAN_MODES = ['force_custom_plan', 'force_generic_plan'] as const;
export type PlanMode = (typeof PLAN_MODES)[number];

/**
 * A test of plans: `fn` gets a fresh mailroom and a session of its own, ended
 * after; skipped on PGlite.
 *
 * @example
 * itPlans(db, 'the claim probes the primary key', async (t, session) => { … });
 */
export function itPlans(db: TestDatabase, title: string, fn: (t: TestMailroom, session: pg.Client) => Promise<void>): void {
  it(title, { skip: db.name === 'pglite' ? 'needs a session of its own to hold prepared statements' : false }, async () => {
    const t = await db.open();
    const session = new pg.Client({ connectionString: databaseUrl });
    await session.connect();
    try {
      await fn(t, session);
    } finally {
      await session.end();
    }
  });
}

/**
 * Prepares `text` under `mode` (as `<name>_<mode>`) and returns the plan of
 * `EXPLAIN (<options>) EXECUTE` with `args` (SQL literals, comma-separated),
 * one line per plan line. A statement that writes is run: wrap it in a
 * transaction to roll back.
 *
 * @example
 * const plan = await explainPrepared(session, 'force_generic_plan', 'claim', q.claim.text, `'plan', 1000`);
 */
export async function explainPrepared(
  session: pg.Client,
  mode: PlanMode,
  name: string,
  text: string,
  args: string,
  options = 'ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF',
): Promise<string> {
  await session.query(`SET plan_cache_mode = ${mode}`);
  await session.query(`PREPARE ${name}_${mode} AS ${text}`);
  const { rows } = await session.query<{ 'QUERY PLAN': string }>(`EXPLAIN (${options}) EXECUTE ${name}_${mode}${args === '' ? '' : `(${args})`}`);
  return rows.map((r) => r['QUERY PLAN']).join('\n');
}

/**
 * A text array as an SQL literal for `explainPrepared`'s arguments: each
 * element double-quoted with backslashes and quotes escaped, null as NULL,
 * single quotes doubled.
 *
 * @example
 * sqlArray(['a', null]) // `'{"a",NULL}'`
 */
export function sqlArray(values: readonly (string | null)[]): string {
  const element = (v: string | null) => (v === null ? 'NULL' : `"${v.replace(/\\/g, '\\\\').replace(/"/g, '\\"')}"`);
  return `'{${values.map(element).join(',').replace(/'/g, "''")}}'`;
}
