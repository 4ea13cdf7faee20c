/** `mailroom migrate`: creates or upgrades mailroom's tables in a schema. */
import { createMailroom } from '../mailroom.ts';
import { migrations } from '../storage/migrations.ts';
import { schemaOption, type CommandSpec } from './args.ts';
import { chooseDatabase, isTarget, loadCommandConfig } from './command-config.ts';
import { describeTarget, openDatabase } from './database.ts';
import { DATABASE_OPTIONS } from './open-mailroom.ts';
import { startProgress, type Progress } from './progress.ts';

/** The `migrate` command. */
export const migrateCommand: CommandSpec = {
  name: 'migrate',
  summary: "create or upgrade mailroom's tables (safe to run from several processes at once)",
  usage: 'mailroom migrate [--database URL | --data-dir DIR] [--schema NAME] [--config PATH] [--json]',
  options: DATABASE_OPTIONS,
  details:
    'Applies the numbered migrations in sql/migrations/ that the schema does not have yet, in one\n' +
    'transaction under an advisory lock. Running it again, or from several processes at once, is safe.\n' +
    'The database and schema come from the flags, else from the config file (--config, or a\n' +
    'mailroom.config.* here), else DATABASE_URL or the embedded database: the same as start and status.',
  async run(values, io) {
    const loaded = await loadCommandConfig(values, false);
    const chosen = chooseDatabase(values, loaded?.config);
    const schema = schemaOption(values.schema ?? loaded?.config.schema, 'mailroom');
    // A code config that passes its own pool or PGlite instance: used as it is, and left open.
    const kind = isTarget(chosen) ? chosen.kind : typeof (chosen as { exec?: unknown }).exec === 'function' ? 'embedded' : 'postgres'; // PGlite has exec()
    const location = isTarget(chosen) ? describeTarget(chosen) : `the database ${loaded!.display} passes`;
    const db = isTarget(chosen) ? await openDatabase(chosen, 2) : { handle: chosen, close: async () => {} };
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
      io.out.write(`${JSON.stringify({ ok: true, database: kind, location, schema, applied: names, version })}\n`);
      return 0;
    }
    const where = `schema "${schema}" on ${location}`;
    if (applied.length === 0) {
      io.out.write(`${where} is up to date (migration ${version}); nothing to do.\n`);
    } else {
      const list = applied.map((v) => `  ${String(v).padStart(4, '0')}_${all.find((m) => m.version === v)?.name ?? '?'}`).join('\n');
      io.out.write(`Applied ${applied.length} migration${applied.length === 1 ? '' : 's'} to ${where}:\n${list}\nNow at migration ${version}.\n`);
    }
    return 0;
  },
};
