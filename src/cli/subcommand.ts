/**
 * Commands that take words before or between their options (`jobs get ID`):
 * the words are split from the options, and the options are parsed as every
 * other command's are (parseCommandArgs: same errors, same hints).
 */
import { parseArgs } from 'node:util';
import { COMMON_OPTIONS, parseCommandArgs, UsageError, type CommandSpec } from './args.ts';

/** Option values plus whatever a command's own parser adds from its words. */
export type CommandValues = Record<string, string | boolean | undefined>;

/** A command that parses its own arguments because it takes words (a subcommand, an id). */
export interface CommandWithWords extends CommandSpec {
  /** Turns the arguments after the command's name into the values `run` gets; throws a UsageError when they are wrong. */
  parse(args: string[]): CommandValues;
}

/** True when `command` parses its own arguments. */
export function parsesOwnArguments(command: CommandSpec): command is CommandWithWords {
  return typeof (command as Partial<CommandWithWords>).parse === 'function';
}

/**
 * Splits `args` into the words (positionals, in order) and the options, then
 * parses the options strictly with the command's option list.
 *
 * @example
 * splitWords(jobsCommand, ['get', '--json', '0193…']) // { words: ['get', '0193…'], values: { json: true } }
 */
export function splitWords(spec: CommandSpec, args: string[]): { words: string[]; values: CommandValues } {
  const options = { ...spec.options, ...COMMON_OPTIONS };
  const { tokens } = parseArgs({
    args,
    strict: false,
    allowPositionals: true,
    tokens: true,
    options: Object.fromEntries(Object.entries(options).map(([name, o]) => [name, o.short ? { type: o.type, short: o.short } : { type: o.type }])),
  });
  const wordAt = new Set<number>();
  let terminator = -1;
  for (const token of tokens) {
    if (token.kind === 'positional') wordAt.add(token.index);
    else if (token.kind === 'option-terminator') terminator = token.index;
  }
  const words = args.filter((_, i) => wordAt.has(i));
  const rest = args.filter((_, i) => !wordAt.has(i) && i !== terminator);
  return { words, values: parseCommandArgs(spec, rest) };
}

/**
 * Parses `mailroom <command> remove NAME [options]`: the one subcommand and
 * the one name, as `groups` and `targets` take them; `value` names it in the
 * result (and `check` may refuse it with its own error).
 *
 * @example
 * parseRemoveArgs(groupsCommand, args, { noun: 'group', value: 'group', hint: 'e.g. mailroom groups remove billing-v1' })
 */
export function parseRemoveArgs(spec: CommandSpec, args: string[], words: { noun: string; value: string; hint: string; check?: (name: string) => void }): CommandValues {
  const { words: given, values } = splitWords(spec, args);
  if (values.help) return values;
  const { noun, hint } = words;
  const [sub, name, ...rest] = given;
  if (sub === undefined) throw new UsageError(`mailroom ${spec.name}: expected a subcommand: remove`, hint);
  if (sub !== 'remove') throw new UsageError(`mailroom ${spec.name}: unknown subcommand "${sub}"`, `${spec.name} has: remove; ${hint}`);
  if (name === undefined || name === '') throw new UsageError(`mailroom ${spec.name} remove: expected the name of the ${noun} to remove`, hint);
  if (rest.length > 0) throw new UsageError(`mailroom ${spec.name} remove: expected one ${noun} name, got ${given.length - 1}: ${given.slice(1).join(' ')}`, hint);
  try {
    words.check?.(name);
  } catch (error) {
    throw new UsageError((error as Error).message, hint);
  }
  return { ...values, subcommand: sub, [words.value]: name };
}
