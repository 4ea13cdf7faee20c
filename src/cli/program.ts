/**
 * The `mailroom` command line as a function: `main(argv, io)` dispatches to
 * one small file per command and resolves to the exit code (usage mistakes 2
 * with a hint, failures 1). Importing it runs nothing; the program's entry is
 * main.ts.
 */
import { readFileSync } from 'node:fs';
import { closest, EXIT_FAILURE, EXIT_USAGE, parseCommandArgs, UsageError, type CommandSpec, type Io } from './args.ts';
import { benchCommand } from './bench.ts';
import { demoCommand } from './demo.ts';
import { dlqCommand } from './dlq.ts';
import { doctorCommand } from './doctor.ts';
import { groupsCommand } from './groups.ts';
import { targetsCommand } from './targets.ts';
import { dashboardCommand } from './dashboard.ts';
import { commandHelp, overviewHelp } from './help.ts';
import { jobsCommand } from './jobs.ts';
import { migrateCommand } from './migrate.ts';
import { parkedCommand } from './parked.ts';
import { startCommand } from './start.ts';
import { statusCommand } from './status.ts';
import { parsesOwnArguments } from './subcommand.ts';

const COMMANDS: readonly CommandSpec[] = [migrateCommand, startCommand, demoCommand, doctorCommand, statusCommand, jobsCommand, dlqCommand, parkedCommand, groupsCommand, targetsCommand, dashboardCommand, benchCommand];

function version(): string {
  try {
    const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version?: string };
    return pkg.version ?? 'unknown';
  } catch {
    return 'unknown';
  }
}

function findCommand(name: string): CommandSpec {
  const command = COMMANDS.find((c) => c.name === name);
  if (command) return command;
  const names = [...COMMANDS.map((c) => c.name), 'help'];
  const guess = closest(name, names);
  throw new UsageError(
    name.startsWith('-') ? `mailroom: unknown option ${name}` : `mailroom: unknown command "${name}"`,
    `${guess ? `did you mean \`mailroom ${guess}\`? ` : ''}commands: ${names.join(', ')}; run \`mailroom help\` for details`,
  );
}

/**
 * Runs the command line `argv` (without node and the script) and resolves to
 * the exit code. Results go to `io.out`, diagnostics to `io.err`.
 *
 * @example
 * const code = await main(['status', '--json']); // 0, with the stats on stdout
 */
export async function main(argv: string[], io: Io = { out: process.stdout, err: process.stderr }): Promise<number> {
  const json = argv.includes('--json');
  let prefix = 'mailroom';
  try {
    const [first, ...rest] = argv;
    if (first === undefined) {
      io.err.write(overviewHelp(COMMANDS, version()));
      return EXIT_USAGE;
    }
    if (first === 'help' || first === '--help' || first === '-h') {
      const topic = rest.find((a) => !a.startsWith('-'));
      io.out.write(topic ? commandHelp(findCommand(topic)) : overviewHelp(COMMANDS, version()));
      return 0;
    }
    if (first === '--version' || first === 'version') {
      io.out.write(`${version()}\n`);
      return 0;
    }
    const command = findCommand(first);
    prefix = `mailroom ${command.name}`;
    const values = parsesOwnArguments(command) ? command.parse(rest) : parseCommandArgs(command, rest);
    if (values.help) {
      io.out.write(commandHelp(command));
      return 0;
    }
    return await command.run(values, io);
  } catch (error) {
    return report(error, json, io, prefix);
  }
}

function report(error: unknown, json: boolean, io: Io, prefix: string): number {
  const usage = error instanceof UsageError;
  const code = usage ? EXIT_USAGE : EXIT_FAILURE;
  let message = error instanceof Error ? error.message : String(error);
  if (!message.startsWith('mailroom')) message = `${prefix}: ${message}`;
  const hint = usage ? error.hint : undefined;
  if (json) {
    io.out.write(`${JSON.stringify({ ok: false, error: { kind: usage ? 'usage' : 'failure', message, ...(hint ? { hint } : {}) } })}\n`);
  } else {
    io.err.write(`${message}\n${hint ? `hint: ${hint}\n` : ''}`);
    if (!usage && process.env.MAILROOM_DEBUG && error instanceof Error && error.stack) io.err.write(`${error.stack}\n`);
  }
  return code;
}
