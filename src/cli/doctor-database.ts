/**
 * `mailroom doctor`'s check of mailroom's schema in the database: migrations
 * applied, the schema dump's indexes present and valid (src/storage/schema-check.ts);
 * and of the server's settings that would hold every commit (src/storage/server-check.ts).
 */
import { existsSync } from 'node:fs';
import type { MailroomConfig } from '../config/define-config.ts';
import { checkSchema, type ReadQuery } from '../storage/schema-check.ts';
import { checkServer } from '../storage/server-check.ts';
import { schemaOption, stringOption } from './args.ts';
import { chooseDatabase, isTarget } from './command-config.ts';
import { describeTarget, openDatabase, type OpenDatabase } from './database.ts';
import type { Check } from './doctor-config.ts';
import type { SafetyWarning } from '../brokers/safety.ts';

/** A handle a code config passes (a pg.Pool or PGlite): both answer `query(sql, params)` with rows. */
interface QueryHandle {
  query(sql: string, params?: unknown[]): Promise<{ rows: unknown[] }>;
}

/**
 * The database check, when a database is named: `--database`, `--data-dir` or
 * `--schema`, the config's `database`, or `DATABASE_URL`; else undefined.
 */
export function databaseCheck(values: Record<string, string | boolean | undefined>, config: MailroomConfig | undefined): Check | undefined {
  const named = stringOption(values.database) !== undefined || stringOption(values['data-dir']) !== undefined || stringOption(values.schema) !== undefined;
  if (!named && config?.database === undefined && !process.env.DATABASE_URL) return undefined;
  const chosen = chooseDatabase(values, config);
  const schema = schemaOption(values.schema ?? config?.schema, 'mailroom');
  let opened: OpenDatabase | undefined;
  return {
    subject: `database schema ${schema}`,
    fromConfig: false,
    run: async () => {
      if (!isTarget(chosen)) {
        const handle = chosen as unknown as QueryHandle;
        const query: ReadQuery = async <R>(sql: string, params?: unknown[]) => (await handle.query(sql, params)).rows as R[];
        return checkAll(query, schema, 'the database the config passes');
      }
      if (chosen.kind === 'embedded' && !existsSync(chosen.dir)) throw new Error(`there is no embedded database in ${chosen.dir} (run mailroom migrate, or name the database with --database)`);
      const db = await openDatabase(chosen, 1);
      opened = db;
      return checkAll((sql, params) => db.query(sql, params), schema, describeTarget(chosen));
    },
    close: async () => {
      await opened?.close();
    },
  };
}

/** The schema's warnings, then the server's. */
async function checkAll(query: ReadQuery, schema: string, where: string): Promise<SafetyWarning[]> {
  return [...(await checkSchema(query, schema, where)), ...(await checkServer(query, where))];
}
