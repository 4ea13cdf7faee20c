/**
 * A mailroom for one test: a schema of its own on an in-memory database
 * (PGlite, nothing on disk) that the process shares, migrated and dropped
 * again on close; or your server's database when you pass one.
 */
import { PGlite } from '@electric-sql/pglite';
import { quoteSchema } from '../identifiers.ts';
import { createMailroom, openMailroom, type Mailroom, type MailroomOptions } from '../mailroom.ts';
import { PgliteDriver } from '../storage/pglite-driver.ts';

/** The in-memory database of this process: made on first use (a few seconds), then shared by schema. */
let memory: Promise<PGlite> | undefined;
let opened = 0;

function memoryDatabase(): Promise<PGlite> {
  memory ??= PGlite.create().catch((error: unknown) => {
    memory = undefined;
    throw error;
  });
  return memory;
}

/** The shared in-memory database, seen through one test's schema: closing drops the schema, not the database. */
class TestSchemaDriver extends PgliteDriver {
  readonly #dropSchema: string;

  constructor(db: PGlite, quotedSchema: string) {
    super(db, false);
    this.#dropSchema = `DROP SCHEMA IF EXISTS ${quotedSchema} CASCADE`;
  }

  override async close(): Promise<void> {
    await this.query(this.#dropSchema);
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
    mailroom = await openMailroom({ ...options, schema }, async () => new TestSchemaDriver(await memoryDatabase(), quoteSchema(schema)));
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
