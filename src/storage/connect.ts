import { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { MailroomError } from '../errors.ts';
import type { Driver } from './driver.ts';
import { PgDriver } from './pg-driver.ts';
import { openPglite } from './pglite-open.ts';
import { PgliteDriver } from './pglite-driver.ts';
import { STALL_CHECK, type StallCheck } from './stalled-statements.ts';

/** Where mailroom keeps its data: a `postgres://` URL, a `pg.Pool`, or a PGlite instance. */
export type DatabaseOption = string | pg.Pool | PGlite;

/** Directory of the embedded database when no database is configured. */
export const DEFAULT_EMBEDDED_DIR = './.mailroom';

function isPglite(value: object): value is PGlite {
  return value instanceof PGlite || (typeof (value as PGlite).exec === 'function' && 'waitReady' in value && typeof (value as PGlite).listen === 'function');
}

function isPgPool(value: object): value is pg.Pool {
  return value instanceof pg.Pool || (typeof (value as pg.Pool).connect === 'function' && 'totalCount' in value);
}

/**
 * Opens the driver for a database option: a URL opens a pool (closed again by
 * mailroom), a pool or PGlite instance you pass stays yours to close, and no
 * option (and no `DATABASE_URL`) opens the embedded PGlite database in
 * `./.mailroom`. An empty string (a `DATABASE_URL` set but empty) is an error,
 * never the embedded database.
 */
export async function connect(database: DatabaseOption | undefined, poolSize: number, stallCheck: StallCheck = STALL_CHECK): Promise<Driver> {
  const chosen = database ?? process.env.DATABASE_URL;
  if (chosen === '') {
    // Most often DATABASE_URL set but empty in a deployment: never fall back to a local database then.
    throw new MailroomError(
      `database: got an empty string${database === undefined ? ' from DATABASE_URL' : ' (is DATABASE_URL set but empty?)'}; give a postgres:// URL, or leave it unset (undefined) for the embedded database in ${DEFAULT_EMBEDDED_DIR}`,
    );
  }
  if (chosen === undefined) {
    const { db } = await openPglite(DEFAULT_EMBEDDED_DIR);
    return new PgliteDriver(db, true);
  }
  if (typeof chosen === 'string') {
    if (!/^postgres(ql)?:\/\//.test(chosen)) {
      throw new MailroomError(
        `database: expected a postgres:// URL, a pg.Pool or a PGlite instance; got a string that is not a postgres:// URL. Leave it unset for the embedded database in ${DEFAULT_EMBEDDED_DIR}`,
      );
    }
    const pool = new pg.Pool({ connectionString: chosen, max: poolSize });
    return new PgDriver(pool, true, undefined, stallCheck);
  }
  if (typeof chosen === 'object' && chosen !== null) {
    if (isPglite(chosen)) {
      await chosen.waitReady;
      return new PgliteDriver(chosen, false);
    }
    if (isPgPool(chosen)) return new PgDriver(chosen, false, undefined, stallCheck);
  }
  throw new MailroomError('database: expected a postgres:// URL, a pg.Pool or a PGlite instance');
}
