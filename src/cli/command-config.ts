/**
 * The config file as commands other than `start` read it: `--config PATH`,
 * else a mailroom.config.* in the current directory when there is one (it is
 * optional for them). What they take from it: the database and schema (after
 * the flags), `redact` (so payloads are redacted in every output), queue
 * owners, and the job definitions it imports (so a replay gives each job its
 * type's attempt budget).
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { PGlite } from '@electric-sql/pglite';
import type pg from 'pg';
import { ConfigError } from '../config/config-error.ts';
import type { MailroomConfig } from '../config/define-config.ts';
import { CONFIG_FILE_NAMES, findConfigFile, loadConfig, type LoadedConfig } from '../config/load-config.ts';
import { stringOption, UsageError } from './args.ts';
import { resolveTarget, type DatabaseTarget } from './database.ts';

/**
 * Loads the config `--config` names (required to exist), else the one in
 * `cwd` if any; undefined when there is none. A broken config is a usage
 * error naming the file and line.
 */
export async function loadCommandConfig(values: Record<string, string | boolean | undefined>, required: boolean): Promise<LoadedConfig | undefined> {
  const cwd = process.cwd();
  const explicit = stringOption(values.config);
  if (!required && explicit === undefined && !CONFIG_FILE_NAMES.some((name) => existsSync(join(cwd, name)))) return undefined;
  try {
    return await loadConfig(findConfigFile(explicit, cwd), cwd);
  } catch (error) {
    if (error instanceof ConfigError) throw new UsageError(error.message, error.hint); // main prefixes `mailroom <command>: `
    throw error;
  }
}

/** The database to open: flag > config > DATABASE_URL > embedded. A pool or PGlite from a code config is used as it is. */
export function chooseDatabase(values: Record<string, string | boolean | undefined>, config: MailroomConfig | undefined): DatabaseTarget | pg.Pool | PGlite {
  const flag = stringOption(values.database);
  const dataDir = stringOption(values['data-dir']);
  if (flag !== undefined || dataDir !== undefined) return resolveTarget(flag, dataDir, false);
  if (typeof config?.database === 'string' && config.database !== '') return resolveTarget(config.database, undefined, false);
  if (typeof config?.database === 'object' && config.database !== null) return config.database;
  return resolveTarget(undefined, undefined, true);
}

/** Whether `chosen` is a target to open (rather than a handle the config made). */
export function isTarget(value: DatabaseTarget | pg.Pool | PGlite): value is DatabaseTarget {
  const kind = (value as DatabaseTarget).kind;
  return kind === 'postgres' || kind === 'embedded';
}
