/** `mailroom migrate`: creates or upgrades mailroom's tables in a schema. */
import { createMailroom } from '../mailroom.ts';
import { migrations } from '../storage/migrations.ts';
import { schemaOption, stringOption, type CommandSpec } from './args.ts';
import { describeTarget, openDatabase, resolveTarget } from './database.ts';
import { startProgress, type Progress } from './progress.ts';

/** The `migrate` command. */
export const migrateCommand: CommandSpec = {
  name: 'migrate',
  summary: "create or upgrade mailroom's tables (safe to run from several processes at once)",
  usage: 'mailroom migrate [--database URL | --data-dir DIR] [--schema NAME] [--json]',
  options: {
    database: { type: 'string', value: 'URL', description: 'PostgreSQL URL; default $DATABASE_URL, else the embedded database' },
    'data-dir': { type: 'string', value: 'DIR', description: 'directory of the embedded PGlite database (default ./.mailroom)' },
    schema: { type: 'string', value: 'NAME', description: "schema for mailroom's tables (default mailroom)" },
  },
  details:
    'Applies the numbered migrations in sql/migrations/ that the schema does not have yet, in one\n' +
    'transaction under an advisory lock. Running it again, or from several processes at once, is safe.',
  async run(values, io) {
    const target = resolveTarget(stringOption(values.database), stringOption(values['data-dir']), true);
    const schema = schemaOption(values.schema, 'mailroom');
    const db = await openDatabase(target, 2);
    let applied: number[];
    try {
      const mailroom = await createMailroom({ database: db.handle, schema });
      try {
        // Progress on stderr (a bar on a terminal, lines elsewhere); the result goes to stdout.
        let progress: Progress | undefined;
        ({ applied } = await mailroom.migrate({
          onProgress: values.json
            ? undefined
            : ({ done, total, next }) => {
                if (total === 0) return;
                progress ??= startProgress(io.err, 'migrate', total);
                progress.update(done);
                if (next === null) progress.finish();
              },
        }));
      } finally {
        await mailroom.close();
      }
    } finally {
      await db.close();
    }
    const all = migrations();
    const version = all.at(-1)?.version ?? 0;
    if (values.json) {
      const names = applied.map((v) => `${String(v).padStart(4, '0')}_${all.find((m) => m.version === v)?.name ?? ''}`);
      io.out.write(`${JSON.stringify({ ok: true, database: target.kind, location: describeTarget(target), schema, applied: names, version })}\n`);
      return 0;
    }
    const where = `schema "${schema}" on ${describeTarget(target)}`;
    if (applied.length === 0) {
      io.out.write(`${where} is up to date (migration ${version}); nothing to do.\n`);
    } else {
      const list = applied.map((v) => `  ${String(v).padStart(4, '0')}_${all.find((m) => m.version === v)?.name ?? '?'}`).join('\n');
      io.out.write(`Applied ${applied.length} migration${applied.length === 1 ? '' : 's'} to ${where}:\n${list}\nNow at migration ${version}.\n`);
    }
    return 0;
  },
};
