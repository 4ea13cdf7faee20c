import type { NamedQuery } from '../storage/driver.ts';
import { namedQueries } from '../storage/named.ts';

/** Statements `mailroom start` runs before it starts anything: is the schema migrated, and how far. */
export interface StartQueries {
  /** $1 the quoted `<schema>.migrations` name; one row `{ present }`. */
  migrationsTable: NamedQuery;
  /** One row `{ version }`: the newest migration applied (0 when none). */
  appliedVersion: NamedQuery;
}

/** Builds the statements for a quoted schema name. */
export function startQueries(quotedSchema: string): StartQueries {
  const q = namedQueries(quotedSchema);
  return {
    migrationsTable: q('start_migrations_table', 'SELECT to_regclass($1) IS NOT NULL AS present'),
    appliedVersion: q('start_applied_version', `SELECT coalesce(max(version), 0)::int AS version FROM ${quotedSchema}.migrations`),
  };
}
