/**
 * Which database a command uses: `--database URL`; else the embedded PGlite
 * database in `--data-dir` when given; else (for commands that honour it)
 * `DATABASE_URL`; else the embedded database in `./.mailroom`.
 */
import type { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { DEFAULT_EMBEDDED_DIR } from '../storage/connect.ts';
import { openPglite } from '../storage/pglite-open.ts';
import { redactUrl, UsageError } from './args.ts';

/** A database a command will open. */
export type DatabaseTarget = { kind: 'postgres'; url: string } | { kind: 'embedded'; dir: string };

/** An open database: the handle to give `createMailroom`, plain queries, and close. */
export interface OpenDatabase {
  target: DatabaseTarget;
  handle: PGlite | pg.Pool;
  query<R = Record<string, unknown>>(sql: string, params?: unknown[]): Promise<R[]>;
  close(): Promise<void>;
}

/**
 * Picks the database from the options. `useEnv`: fall back to `DATABASE_URL`
 * when `--database` is not given (the demo does not, so that it stays on the
 * embedded database unless asked).
 */
export function resolveTarget(database: string | undefined, dataDir: string | undefined, useEnv: boolean): DatabaseTarget {
  if (database !== undefined && dataDir !== undefined) {
    throw new UsageError('--database and --data-dir cannot be used together', '--data-dir is for the embedded database; drop one of them');
  }
  // An explicit --data-dir asks for the embedded database, whatever DATABASE_URL says.
  const url = database ?? (useEnv && dataDir === undefined && process.env.DATABASE_URL ? process.env.DATABASE_URL : undefined);
  if (url !== undefined) {
    if (!/^postgres(ql)?:\/\/./.test(url)) {
      const from = database !== undefined ? '--database' : 'DATABASE_URL';
      throw new UsageError(
        `${from}: expected a postgres:// URL, got ${JSON.stringify(redactUrl(url))}`,
        `write it like postgres://user:password@host:5432/dbname, or leave it out for the embedded database in ${DEFAULT_EMBEDDED_DIR} (--data-dir DIR to put it elsewhere)`,
      );
    }
    return { kind: 'postgres', url };
  }
  if (dataDir === '') throw new UsageError('--data-dir: expected a directory, got an empty string');
  return { kind: 'embedded', dir: dataDir ?? DEFAULT_EMBEDDED_DIR };
}

/** A short description for output: the URL without its password, or the embedded directory. */
export function describeTarget(target: DatabaseTarget): string {
  return target.kind === 'postgres' ? redactUrl(target.url) : `embedded PGlite in ${target.dir}`;
}

/**
 * Opens the target: a pg.Pool of `poolSize` connections, or PGlite on the
 * directory (created when missing). Fails with a message that says how to fix
 * an unreachable server.
 */
export async function openDatabase(target: DatabaseTarget, poolSize = 4): Promise<OpenDatabase> {
  if (target.kind === 'embedded') {
    const { db } = await openPglite(target.dir);
    return {
      target,
      handle: db,
      query: async (sql, params) => (await db.query(sql, params)).rows as never,
      close: async () => {
        if (!db.closed) await db.close();
      },
    };
  }
  const pool = new pg.Pool({ connectionString: target.url, max: poolSize });
  pool.on('error', () => {}); // an idle client dropped by the server; the pool replaces it
  try {
    await pool.query('SELECT 1');
  } catch (error) {
    await pool.end().catch(() => {});
    throw unreachable(error, target.url);
  }
  return {
    target,
    handle: pool,
    query: async (sql, params) => (await pool.query(sql, params)).rows,
    close: () => pool.end(),
  };
}

function unreachable(error: unknown, url: string): Error {
  const reason = error instanceof Error ? error.message || (error as { code?: string }).code || error.name : String(error);
  return new Error(
    `cannot use the database at ${redactUrl(url)}: ${reason}. Check that PostgreSQL is running and that the URL (--database or DATABASE_URL) has the right host, port, user, password and database name`,
    { cause: error },
  );
}
