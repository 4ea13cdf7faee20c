import { readFileSync, readdirSync } from 'node:fs';
import { quoteSchema } from '../identifiers.ts';
import type { Driver } from './driver.ts';
import { MailroomError } from '../errors.ts';

/** One numbered, forward-only migration. Each file ends by recording its version in `<schema>.migrations`. */
export interface Migration {
  version: number;
  name: string;
  /** The SQL with `:"schema"` where the schema name goes (psql's variable syntax). */
  template: string;
}

const MIGRATIONS_DIR = new URL('../../sql/migrations/', import.meta.url);

/**
 * The migrations shipped with this version, in order. For users' own
 * migration tools: pass each through {@link migrationSql}, or run the files in
 * `sql/migrations/` with `psql -v schema=mailroom`.
 *
 * @example
 * for (const m of migrations()) await db.query(migrationSql(m, 'mailroom'));
 */
export function migrations(): Migration[] {
  return readdirSync(MIGRATIONS_DIR)
    .filter((file) => /^\d{4}_[a-z0-9_]+\.sql$/.test(file))
    .sort()
    .map((file) => ({
      version: Number(file.slice(0, 4)),
      name: file.slice(5, -4),
      template: readFileSync(new URL(file, MIGRATIONS_DIR), 'utf8'),
    }));
}

/**
 * A migration's SQL for one schema (the name is validated, then quoted).
 *
 * @example
 * migrationSql(migrations()[0], 'mailroom')
 */
export function migrationSql(migration: Migration, schema: string): string {
  const quoted = quoteSchema(schema);
  return migration.template.replaceAll(':"schema"', quoted);
}

/**
 * Applies the migrations not yet applied, in one transaction that holds an
 * advisory lock per schema, so several processes may call it at once: one
 * applies, the others wait and then find nothing to do.
 */
/** Where `migrate` reports each step: the migration about to be applied (`done` of `total` pending applied so far), and at the end. */
export type MigrationProgress = (step: { done: number; total: number; next: { version: number; name: string } | null }) => void;

export async function migrate(driver: Driver, schema: string, onProgress?: MigrationProgress): Promise<{ applied: number[] }> {
  const quoted = quoteSchema(schema);
  const all = migrations();
  return driver.transaction(async (tx) => {
    await tx.query('SELECT pg_advisory_xact_lock(hashtext($1))', [`mailroom.migrate:${schema}`]);
    await tx.exec(`CREATE SCHEMA IF NOT EXISTS ${quoted};
      CREATE TABLE IF NOT EXISTS ${quoted}.migrations (
        version integer PRIMARY KEY,
        name text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now()
      );`);
    const { rows } = await tx.query<{ version: number }>(`SELECT version FROM ${quoted}.migrations ORDER BY version`);
    const done = new Set(rows.map((r) => r.version));
    const newest = all.at(-1)?.version ?? 0;
    const unknown = rows.find((r) => r.version > newest);
    if (unknown) {
      throw new MailroomError(
        `schema ${schema} has migration ${unknown.version}, newer than this mailroom knows (${newest}); upgrade mailroom in this process or use another schema`,
      );
    }
    const applied: number[] = [];
    const pending = all.filter((m) => !done.has(m.version));
    for (const migration of pending) {
      onProgress?.({ done: applied.length, total: pending.length, next: { version: migration.version, name: migration.name } });
      await tx.exec(migrationSql(migration, schema)); // records itself in <schema>.migrations
      applied.push(migration.version);
    }
    onProgress?.({ done: applied.length, total: pending.length, next: null });
    return { applied };
  });
}
