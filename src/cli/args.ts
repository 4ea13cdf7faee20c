/**
 * Shared pieces of the command line: option parsing on `node:util` parseArgs
 * with errors that name the bad option and say what to do, and the error
 * types `main` turns into exit codes.
 */
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { quoteSchema } from '../identifiers.ts';
import { closest } from '../closest.ts';

export { closest };

/** Exit code for bad usage (unknown command or option, missing value). */
export const EXIT_USAGE = 2;
/** Exit code for a command that ran and failed. */
export const EXIT_FAILURE = 1;

/** A mistake in the command line itself; `main` prints it with a hint and exits with 2. */
export class UsageError extends Error {
  override name = 'UsageError';
  constructor(
    message: string,
    readonly hint?: string,
  ) {
    super(message);
  }
}

/** One option of a command, as parseArgs takes it, plus what `help` says about it. */
export interface OptionSpec {
  type: 'string' | 'boolean';
  short?: string;
  /** Placeholder of the value in help, e.g. `URL`. */
  value?: string;
  description: string;
}

/** A command: its name, one-line summary, options and what it does. */
export interface CommandSpec {
  name: string;
  summary: string;
  usage: string;
  options: Record<string, OptionSpec>;
  /** Extra paragraphs for `mailroom help <command>`. */
  details?: string;
  run(values: Record<string, string | boolean | undefined>, io: Io): Promise<number>;
}

/** Where a command writes: stdout for results, stderr for progress and diagnostics. */
export interface Io {
  out: NodeJS.WritableStream & { isTTY?: boolean };
  err: NodeJS.WritableStream & { isTTY?: boolean };
}

/** Options every command takes. */
export const COMMON_OPTIONS: Record<string, OptionSpec> = {
  json: { type: 'boolean', description: 'print the result as JSON (for scripts) instead of text for people' },
  help: { type: 'boolean', short: 'h', description: 'show help for this command' },
};

function optionList(options: Record<string, OptionSpec>): string {
  return Object.keys(options)
    .map((name) => `--${name}`)
    .join(', ');
}

/**
 * Parses a command's arguments strictly. Unknown options, missing values and
 * stray arguments become a {@link UsageError} naming the culprit, with a
 * "did you mean" when one is close and the list of valid options.
 */
export function parseCommandArgs(spec: CommandSpec, args: string[]): Record<string, string | boolean | undefined> {
  const options = { ...spec.options, ...COMMON_OPTIONS };
  const config: ParseArgsConfig = {
    args,
    strict: true,
    allowPositionals: false,
    options: Object.fromEntries(
      Object.entries(options).map(([name, o]) => [name, o.short ? { type: o.type, short: o.short } : { type: o.type }]),
    ),
  };
  try {
    return parseArgs(config).values as Record<string, string | boolean | undefined>;
  } catch (error) {
    throw toUsageError(error, spec, options);
  }
}

function toUsageError(error: unknown, spec: CommandSpec, options: Record<string, OptionSpec>): Error {
  const code = (error as { code?: unknown }).code;
  const message = error instanceof Error ? error.message : String(error);
  const quoted = /'([^']+)'/.exec(message)?.[1] ?? '';
  const helpHint = `run \`mailroom help ${spec.name}\` to see its options`;
  if (code === 'ERR_PARSE_ARGS_UNKNOWN_OPTION') {
    const bare = quoted.replace(/^-+/, '').split('=')[0]!;
    const guess = closest(bare, Object.keys(options));
    return new UsageError(
      `mailroom ${spec.name}: unknown option ${quoted}`,
      `${guess ? `did you mean --${guess}? ` : ''}${spec.name} takes ${optionList(options)}; ${helpHint}`,
    );
  }
  if (code === 'ERR_PARSE_ARGS_INVALID_OPTION_VALUE') {
    const name = quoted.split(' ')[0] ?? quoted;
    const option = options[name.replace(/^-+/, '')];
    if (option?.type === 'boolean') {
      return new UsageError(`mailroom ${spec.name}: option ${name} is a switch and takes no value`, `write ${name} alone; ${helpHint}`);
    }
    return new UsageError(
      `mailroom ${spec.name}: option ${name} needs a value`,
      `write ${name} ${option?.value ?? 'VALUE'} (or ${name}=${option?.value ?? 'VALUE'}); ${helpHint}`,
    );
  }
  if (code === 'ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL') {
    return new UsageError(`mailroom ${spec.name}: unexpected argument '${quoted}'`, `${spec.name} takes only options (${optionList(options)}); ${helpHint}`);
  }
  return new UsageError(`mailroom ${spec.name}: ${message}`, helpHint);
}

/**
 * Reads a whole-number option within bounds, or throws a {@link UsageError}
 * naming the option and the accepted range.
 */
export function integerOption(value: string | boolean | undefined, name: string, fallback: number, min: number, max: number): number {
  if (value === undefined) return fallback;
  const n = typeof value === 'string' && /^\d+$/.test(value.trim()) ? Number(value) : Number.NaN;
  if (!Number.isSafeInteger(n) || n < min || n > max) {
    throw new UsageError(`option --${name}: expected a whole number from ${min} to ${max}, got ${JSON.stringify(value)}`);
  }
  return n;
}

/** Reads a string option, or undefined. */
export function stringOption(value: string | boolean | undefined): string | undefined {
  return typeof value === 'string' ? value : undefined;
}

/** Reads `--schema`, checked as mailroom checks it, or throws a {@link UsageError} saying what a valid name is. */
export function schemaOption(value: string | boolean | undefined, fallback: string): string {
  const schema = typeof value === 'string' ? value : fallback;
  try {
    quoteSchema(schema);
  } catch (error) {
    throw new UsageError(`option --${error instanceof Error ? error.message : String(error)}`);
  }
  return schema;
}

/** `postgres://user:secret@host/db` → `postgres://user:***@host/db`, for output and logs. */
export function redactUrl(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password) parsed.password = '***';
    return parsed.toString();
  } catch {
    return url.replace(/\/\/([^:/@]+):[^@]*@/, '//$1:***@');
  }
}
