/** Help text: the overview (`mailroom help`) and one command (`mailroom help migrate`). */
import { COMMON_OPTIONS, type CommandSpec, type OptionSpec } from './args.ts';

function optionLines(options: Record<string, OptionSpec>): string {
  const rows = Object.entries(options).map(([name, o]) => {
    const flag = `${o.short ? `-${o.short}, ` : ''}--${name}${o.value ? ` ${o.value}` : ''}`;
    return [flag, o.description] as const;
  });
  const width = Math.max(...rows.map(([flag]) => flag.length)) + 2;
  return rows.map(([flag, text]) => `  ${flag.padEnd(width)}${text}`).join('\n');
}

/** `mailroom help`: every command with its summary. */
export function overviewHelp(commands: readonly CommandSpec[], version: string): string {
  const width = Math.max(...commands.map((c) => c.name.length)) + 2;
  return [
    `mailroom ${version}: a durable job queue on PostgreSQL (embedded PGlite by default)`,
    '',
    'Usage: mailroom <command> [options]',
    '',
    'Commands:',
    ...commands.map((c) => `  ${c.name.padEnd(width)}${c.summary}`),
    `  ${'help'.padEnd(width)}show this help, or a command's: mailroom help <command>`,
    '',
    'Every command takes --json (output for scripts) and --help.',
    'Database: --database postgres://... or $DATABASE_URL; without either, the embedded database in ./.mailroom.',
    'Exit codes: 0 success, 1 the command failed, 2 bad usage; 3 from `status --check` when a threshold is crossed; 130 when Ctrl-C stopped a `dlq` replay or discard.',
    '',
  ].join('\n');
}

/** `mailroom help <command>` and `mailroom <command> --help`. */
export function commandHelp(command: CommandSpec): string {
  return [
    `mailroom ${command.name}: ${command.summary}`,
    '',
    `Usage: ${command.usage}`,
    '',
    'Options:',
    optionLines({ ...command.options, ...COMMON_OPTIONS }),
    ...(command.details ? ['', command.details] : []),
    '',
  ].join('\n');
}
