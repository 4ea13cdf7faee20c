/**
 * Checks an installed schema against what this version of mailroom expects:
 * every migration applied, and every index of the committed schema dump
 * (sql/schema.sql) present and valid. A missing index turns a claim, a
 * completion or a prune into a read of the whole table; an invalid one (a
 * `CREATE INDEX CONCURRENTLY` or `REINDEX` that failed) is kept up to date
 * but never used. Used by `mailroom doctor`.
 */
import { readFileSync } from 'node:fs';
import type { SafetyWarning } from '../brokers/safety.ts';
import { quoteSchema } from '../identifiers.ts';
import { migrations } from './migrations.ts';

const SCHEMA_DUMP = new URL('../../sql/schema.sql', import.meta.url);
const INDEX_LINE = /^(-- \(made by its constraint\) )?CREATE (UNIQUE )?INDEX (\w+) ON :"schema"\.(\w+) (.+);$/gm;
const CONSTRAINT_LINE = /^ALTER TABLE :"schema"\.(\w+) ADD CONSTRAINT (\w+) (.+);$/gm;

/** An index the schema dump has: its name, table and statement (for the schema `schema`). */
export interface ExpectedIndex {
  name: string;
  table: string;
  statement: string;
}

/** The indexes of the committed schema dump, each with the statement that makes it in `schema`. */
export function expectedIndexes(schema: string): ExpectedIndex[] {
  const dump = readFileSync(SCHEMA_DUMP, 'utf8');
  const quoted = quoteSchema(schema);
  const constraints = new Map([...dump.matchAll(CONSTRAINT_LINE)].map(([, table = '', name = '', rest = '']) => [name, `ALTER TABLE ${quoted}.${table} ADD CONSTRAINT ${name} ${rest.replaceAll(':"schema"', quoted)};`]));
  return [...dump.matchAll(INDEX_LINE)].map(([, byConstraint, unique = '', name = '', table = '', rest = '']) => ({
    name,
    table,
    // An index a constraint makes is made again by the constraint (a primary key, say).
    statement: (byConstraint !== undefined ? constraints.get(name) : undefined) ?? `CREATE ${unique}INDEX CONCURRENTLY ${name} ON ${quoted}.${table} ${rest.replaceAll(':"schema"', quoted)};`,
  }));
}

/** Runs a read-only statement: a pool, a PGlite instance or a client. */
export type ReadQuery = <R>(sql: string, params?: unknown[]) => Promise<R[]>;

/**
 * Warnings about schema `schema`: `schema-missing` (no mailroom tables),
 * `schema-behind` (migrations not applied), `index-missing` and
 * `index-invalid`, each saying how to fix it.
 *
 * @example
 * const warnings = await checkSchema((sql, params) => pool.query(sql, params).then((r) => r.rows), 'mailroom', 'postgres://db/app');
 */
export async function checkSchema(query: ReadQuery, schema: string, where: string): Promise<SafetyWarning[]> {
  const subject = `schema "${schema}" on ${where}`;
  const quoted = quoteSchema(schema);
  const [table] = await query<{ present: boolean }>(`SELECT to_regclass($1) IS NOT NULL AS present`, [`${quoted}.migrations`]);
  if (!table?.present) {
    return [{ subject, code: 'schema-missing', message: `there are no mailroom tables in schema "${schema}": run \`mailroom migrate --schema ${schema}\` (or mailroom.migrate()) first.` }];
  }
  const warnings: SafetyWarning[] = [];
  const [applied] = await query<{ version: number | null }>(`SELECT max(version)::int AS version FROM ${quoted}.migrations`);
  const newest = migrations().at(-1)?.version ?? 0;
  if ((applied?.version ?? 0) < newest) {
    warnings.push({
      subject,
      code: 'schema-behind',
      message: `the schema is at migration ${applied?.version ?? 0} and this version of mailroom needs ${newest}: run \`mailroom migrate --schema ${schema}\` before starting it.`,
    });
  }
  const present = await query<{ name: string; valid: boolean }>(
    `SELECT c.relname AS name, i.indisvalid AS valid
       FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid JOIN pg_namespace AS n ON n.oid = c.relnamespace
      WHERE n.nspname = $1`,
    [schema],
  );
  const byName = new Map(present.map((p) => [p.name, p.valid]));
  for (const index of expectedIndexes(schema)) {
    const valid = byName.get(index.name);
    if (valid === undefined) {
      warnings.push({
        subject,
        code: 'index-missing',
        message: `index ${index.name} on ${index.table} is missing, so the statements it serves read the whole table. Make it again: ${index.statement}`,
      });
    } else if (!valid) {
      warnings.push({
        subject,
        code: 'index-invalid',
        message: `index ${index.name} on ${index.table} is invalid (a CREATE INDEX CONCURRENTLY or REINDEX that failed): PostgreSQL keeps it up to date but never uses it. Rebuild it: REINDEX INDEX CONCURRENTLY ${quoted}.${index.name};`,
      });
    }
  }
  return warnings;
}
