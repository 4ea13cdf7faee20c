/**
 * A mailroom for one test: a schema of its own on an in-memory database
 * (PGlite, nothing on disk) that the process shares, migrated and dropped
 * again on close; or your server's database when you pass one.
 */
import type { PGlite } from '@electric-sql/pglite';
import { quoteSchema } from '../identifiers.ts';
import { createMailroom, openMailroom, type Mailroom, type MailroomOptions } from '../mailroom.ts';
import { PgliteDriver } from '../storage/pglite-driver.ts';
import { openPglite } from '../storage/pglite-open.ts';

/**
 * The in-memory database of this process: made on first use (about 2 s from the cached copy of a
 * fresh one, src/storage/pglite-open.ts), then shared by schema while a test mailroom is open.
 * PGlite arms timers of its own (a 10 s one after most statements) that nothing else clears, and
 * they keep the process alive: once the last test mailroom is closed and none is opened again for
 * {@link IDLE_CLOSE_MS}, the database is closed (which clears them) and the next call makes a new
 * one.
 */
let memory: Promise<PGlite> | undefined;
/** Test mailrooms opening or open on `memory`. */
let users = 0;
let idleClose: ReturnType<typeof setTimeout> | undefined;
let opened = 0;

/** How long the shared database outlives the last test mailroom: the next test's mailroom, opened right after, reuses it. */
const IDLE_CLOSE_MS = 500;

/** Takes the shared database for one test mailroom; {@link releaseMemoryDatabase} gives it back. */
async function acquireMemoryDatabase(): Promise<PGlite> {
  users++;
  if (idleClose !== undefined) {
    clearTimeout(idleClose);
    idleClose = undefined;
  }
  memory ??= openPglite().then(({ db }) => db, (error: unknown) => {
    memory = undefined;
    throw error;
  });
  try {
    return await memory;
  } catch (error) {
    releaseMemoryDatabase();
    throw error;
  }
}

function releaseMemoryDatabase(): void {
  users--;
  if (users > 0 || memory === undefined) return;
  // Unref'd: it never keeps the process alive itself; PGlite's own timers do until it runs.
  idleClose = setTimeout(() => {
    idleClose = undefined;
    if (users > 0 || memory === undefined) return;
    const closing = memory;
    memory = undefined;
    closing.then((db) => db.close()).catch(() => {});
  }, IDLE_CLOSE_MS);
  idleClose.unref();
}

/** The shared in-memory database, seen through one test's schema: closing drops the schema and gives the database back. */
class TestSchemaDriver extends PgliteDriver {
  readonly #dropSchema: string;
  #closing: Promise<void> | undefined;

  constructor(db: PGlite, quotedSchema: string) {
    super(db, false);
    this.#dropSchema = `DROP SCHEMA IF EXISTS ${quotedSchema} CASCADE`;
  }

  override close(): Promise<void> {
    this.#closing ??= (async () => {
      try {
        await this.query(this.#dropSchema);
      } finally {
        releaseMemoryDatabase();
      }
    })();
    return this.#closing;
  }
}

/**
 * Opens a migrated mailroom for a test. Without `database`: in a schema of
 * its own (`schema`, or a new `mailroom_test_…` name) on an in-memory PGlite
 * database that the process shares, dropped on `close()`, so tests do not see
 * each other's jobs and need no server; the first call takes a few seconds
 * (the database starts), later ones milliseconds. `DATABASE_URL` is not read.
 * With `database` (a URL or pool of a PostgreSQL server): as `createMailroom`
 * opens it, the schema left in place; give each test its own `schema`.
 *
 * @example
 * const mailroom = await createTestMailroom();
 * try { await signUp(mailroom, 'ada@example.com'); } finally { await mailroom.close(); }
 */
export async function createTestMailroom(options: MailroomOptions = {}): Promise<Mailroom> {
  let mailroom: Mailroom;
  if (options.database === undefined) {
    const schema = options.schema ?? `mailroom_test_${process.pid.toString(36)}_${(opened++).toString(36)}`;
    let driver: TestSchemaDriver | undefined;
    try {
      mailroom = await openMailroom({ ...options, schema }, async () => (driver = new TestSchemaDriver(await acquireMemoryDatabase(), quoteSchema(schema))));
    } catch (error) {
      await driver?.close().catch(() => {});
      throw error;
    }
  } else {
    mailroom = await createMailroom(options);
  }
  try {
    await mailroom.migrate();
  } catch (error) {
    await mailroom.close();
    throw error;
  }
  return mailroom;
}
