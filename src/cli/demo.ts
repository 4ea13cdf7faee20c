/** `mailroom demo`: the main job, a crash-and-recover run that ends with a ledger counted from the database. */
import { toMilliseconds } from '../duration.ts';
import { formatLedger } from '../demo/report.ts';
import { Progress } from '../demo/progress.ts';
import { runDemo, SchemaInUseError } from '../demo/run.ts';
import { demoSchemaName } from '../demo/tables.ts';
import { EXIT_FAILURE, integerOption, schemaOption, stringOption, UsageError, type CommandSpec } from './args.ts';
import { openDatabase, resolveTarget } from './database.ts';

/** The `demo` command. */
export const demoCommand: CommandSpec = {
  name: 'demo',
  summary: 'enqueue a few thousand jobs, crash workers mid-job, and print a ledger proving nothing was lost',
  usage: 'mailroom demo [--jobs N] [--workers N] [--crashes N] [--database URL | --data-dir DIR] [--json]',
  options: {
    jobs: { type: 'string', value: 'N', description: 'jobs to enqueue, 20 to 1000000 (default 3000)' },
    workers: { type: 'string', value: 'N', description: 'workers running at once, 1 to 32 (default 4)' },
    concurrency: { type: 'string', value: 'N', description: 'jobs each worker runs at once, 1 to 100 (default 10)' },
    crashes: { type: 'string', value: 'N', description: 'workers to crash mid-job, 0 to 20 (default 3)' },
    database: { type: 'string', value: 'URL', description: 'run on this PostgreSQL server, workers as child processes killed with SIGKILL' },
    'data-dir': { type: 'string', value: 'DIR', description: 'directory of the embedded database (default ./.mailroom)' },
    schema: { type: 'string', value: 'NAME', description: 'schema to create for this run (default demo_<time>, new each run)' },
    timeout: { type: 'string', value: 'DURATION', description: 'give up after this long: 90 (seconds), 90s, 5m (default 2m)' },
    drop: { type: 'boolean', description: 'drop the demo schema when done (default: keep it to look at)' },
    quiet: { type: 'boolean', short: 'q', description: 'no progress output, only the ledger' },
  },
  details: [
    'The workload is a small shop: receipts that just work, inventory syncs that fail twice and then',
    'succeed, declined cards (PermanentError), a partner API that never answers (exhausts maxAttempts)',
    'and one job type no worker handles. Workers use a 1s lease; some are crashed while holding jobs.',
    '',
    'On the embedded database (the default: PGlite, one process) the workers run inside the demo and a',
    'crash is an abrupt stop: no completion, no release, no heartbeats. With --database the workers are',
    'child processes and a crash is SIGKILL. Either way the leases expire and maintenance rescues the jobs.',
    'The demo ignores DATABASE_URL: it uses a server only when --database is given.',
    '',
    'The ledger is counted from the database. Exit code 1 if any committed job was lost, a handler run',
    'started after its job had completed, an effect was applied twice or went missing, or a job ended',
    'otherwise than planned.',
  ].join('\n'),
  async run(values, io) {
    const target = resolveTarget(stringOption(values.database), stringOption(values['data-dir']), false);
    const jobs = integerOption(values.jobs, 'jobs', 3000, 20, 1_000_000);
    const workers = integerOption(values.workers, 'workers', 4, 1, 32);
    const concurrency = integerOption(values.concurrency, 'concurrency', 10, 1, 100);
    const crashes = integerOption(values.crashes, 'crashes', 3, 0, 20);
    const schema = schemaOption(values.schema, demoSchemaName());
    let timeoutMs: number;
    try {
      const timeout = stringOption(values.timeout) ?? '2m';
      timeoutMs = toMilliseconds(/^\d+(\.\d+)?$/.test(timeout) ? `${timeout}s` : timeout, 'timeout'); // a bare number is seconds
    } catch (error) {
      throw new UsageError(`option --${error instanceof Error ? error.message : String(error)}`);
    }
    const progress = new Progress(io.err, values.quiet !== true);
    const db = await openDatabase(target, 4);
    let ledger;
    try {
      ledger = await runDemo(db, { schema, jobs, workers, concurrency, crashes, timeoutMs, drop: values.drop === true, progress });
    } catch (error) {
      if (error instanceof SchemaInUseError) throw new UsageError(error.message);
      throw error;
    } finally {
      await db.close();
    }
    io.out.write(values.json ? `${JSON.stringify(ledger, null, 2)}\n` : formatLedger(ledger));
    if (ledger.ok) return 0;
    io.err.write(
      ledger.stoppedEarly
        ? `mailroom demo: ${ledger.stoppedEarly === 'timeout' ? 'timed out (raise --timeout)' : 'interrupted'} before every job finished\n`
        : 'mailroom demo: FAILED: see lost, runAfterCompletion, effects and unexpected in the ledger\n',
    );
    return ledger.stoppedEarly === 'interrupted' ? 130 : EXIT_FAILURE;
  },
};
