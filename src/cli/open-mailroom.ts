/**
 * The database options of the commands that read an existing mailroom
 * (`status`, `jobs`), and opening it: `--database`, else `--data-dir`, else
 * `DATABASE_URL`, else the embedded database in ./.mailroom, which must exist
 * (these commands never create a database).
 */
import { existsSync } from 'node:fs';
import { createMailroom, type Mailroom } from '../mailroom.ts';
import { DEFAULT_EMBEDDED_DIR } from '../storage/connect.ts';
import { schemaOption, stringOption, type OptionSpec } from './args.ts';
import { describeTarget, openDatabase, type DatabaseTarget } from './database.ts';
import { chooseDatabase, isTarget, loadCommandConfig } from './command-config.ts';

/** `--database`, `--data-dir` and `--schema`, as `migrate` has them. */
export const DATABASE_OPTIONS: Record<string, OptionSpec> = {
  database: { type: 'string', value: 'URL', description: 'PostgreSQL URL; default $DATABASE_URL, else the embedded database' },
  'data-dir': { type: 'string', value: 'DIR', description: 'directory of the embedded PGlite database (default ./.mailroom)' },
  schema: { type: 'string', value: 'NAME', description: "schema of mailroom's tables (default mailroom)" },
  config: {
    type: 'string',
    value: 'PATH',
    description: 'config file whose database, schema, redact and queue owners apply (default: mailroom.config.* here, if any)',
  },
};

/** Where a command's mailroom is, for its output. */
export interface OpenedAt {
  target: DatabaseTarget;
  schema: string;
  /** `schema "mailroom" on postgres://…` */
  where: string;
}

/**
 * Opens the mailroom the options name, runs `fn` with it and closes it again.
 * An embedded directory that does not exist is an error saying how to make
 * one or where to point instead; an unreachable server names the URL.
 *
 * @example
 * await withMailroom(values, (mailroom) => mailroom.stats());
 */
export async function withMailroom<T>(values: Record<string, string | boolean | undefined>, fn: (mailroom: Mailroom, at: OpenedAt) => Promise<T>): Promise<T> {
  const loaded = await loadCommandConfig(values, false);
  const config = loaded?.config;
  const chosen = chooseDatabase(values, config);
  const schema = schemaOption(values.schema ?? config?.schema, 'mailroom');
  if (!isTarget(chosen)) {
    // A code config that passes its own pool or PGlite instance: used as it is, and left open.
    const mailroom = await createMailroom({ database: chosen, schema, redact: config?.redact, queues: config?.queues });
    return fn(mailroom, { target: { kind: 'postgres', url: 'the database the config passes' }, schema, where: `schema "${schema}" on the database ${loaded!.display} passes` });
  }
  const target = chosen;
  if (target.kind === 'embedded' && !existsSync(target.dir)) {
    throw new Error(
      `there is no embedded database in ${target.dir}. Run \`mailroom migrate${target.dir === DEFAULT_EMBEDDED_DIR ? '' : ` --data-dir ${target.dir}`}\` first, ` +
        'or point at your database with --database postgres://… (or DATABASE_URL), or at another embedded one with --data-dir DIR',
    );
  }
  const db = await openDatabase(target, 2);
  try {
    const mailroom = await createMailroom({ database: db.handle, schema, redact: config?.redact, queues: config?.queues });
    try {
      return await fn(mailroom, { target, schema, where: `schema "${schema}" on ${describeTarget(target)}` });
    } finally {
      await mailroom.close();
    }
  } finally {
    await db.close();
  }
}
