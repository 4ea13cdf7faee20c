/**
 * Test databases: PGlite always, PostgreSQL when TEST_DATABASE_URL is set.
 * Each test gets its own schema, so no test sees another's data.
 */
import { after } from 'node:test';
import type { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { createMailroom, type Mailroom, type MailroomOptions } from '../../src/index.ts';
import { openPglite } from '../../src/storage/pglite-open.ts';

export interface TestDatabase {
  name: 'pglite' | 'postgres';
  /** A migrated mailroom in a fresh schema; closed and dropped after the file's tests. */
  open(options?: Omit<MailroomOptions, 'database' | 'schema'>): Promise<TestMailroom>;
  /** The shared handle: a PGlite instance or a pg.Pool. */
  handle(): Promise<PGlite | pg.Pool>;
}

export interface TestMailroom {
  mailroom: Mailroom;
  schema: string;
  /** Runs SQL against the test database (outside mailroom). */
  sql<R = Record<string, unknown>>(text: string, params?: unknown[]): Promise<R[]>;
}

let pglite: Promise<PGlite> | undefined;
let pool: pg.Pool | undefined;
const opened: { mailroom: Mailroom; schema: string; db: TestDatabase }[] = [];
let counter = 0;

export const databaseUrl = process.env.TEST_DATABASE_URL;

export function uniqueSchema(prefix = 't'): string {
  return `${prefix}_${process.pid}_${Date.now().toString(36)}_${(counter++).toString(36)}`;
}

async function runSql<R>(handle: PGlite | pg.Pool, text: string, params: unknown[] = []): Promise<R[]> {
  const result = await (handle as pg.Pool).query(text, params);
  return result.rows as R[];
}

function makeDatabase(name: 'pglite' | 'postgres', handle: () => Promise<PGlite | pg.Pool>): TestDatabase {
  const db: TestDatabase = {
    name,
    handle,
    async open(options = {}) {
      const h = await handle();
      const schema = uniqueSchema();
      const mailroom = await createMailroom({ ...options, database: h, schema });
      await mailroom.migrate();
      opened.push({ mailroom, schema, db });
      return { mailroom, schema, sql: (text, params) => runSql(h, text, params) };
    },
  };
  return db;
}

/** The databases this run tests against. */
export function testDatabases(): TestDatabase[] {
  const list = [makeDatabase('pglite', () => (pglite ??= openPglite().then(({ db }) => db)))];
  if (databaseUrl) {
    list.push(makeDatabase('postgres', async () => (pool ??= new pg.Pool({ connectionString: databaseUrl, max: 20 }))));
  }
  return list;
}

after(async () => {
  for (const { mailroom, schema, db } of opened.splice(0)) {
    await mailroom.close({ timeout: 1000 }).catch(() => {});
    await runSql(await db.handle(), `DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => {});
  }
  if (pglite) await (await pglite).close();
  if (pool) await pool.end();
});
