/**
 * `mailroom dlq list|show|replay|discard`: the dead-letter queue from the
 * command line, on `mailroom.deadLetters` (docs/DEAD-LETTERS.md). Replay and
 * discard show progress on stderr and stop cleanly on Ctrl-C (SIGINT) after
 * the batch in flight, printing what was done, with exit code 130.
 */
import { parseArgs } from 'node:util';
import { ValidationError } from '../errors.ts';
import { isUuid } from '../ids.ts';
import { decodeCursor } from '../dead-letters/cursor.ts';
import { hasCriterion, parseTime, resolveFilter, TIME_FORMS, type DeadLetterFilter } from '../dead-letters/filter.ts';
import { defaultActor, type DiscardResult, type ReplayResult } from '../dead-letters/replay.ts';
import { COMMON_OPTIONS, EXIT_FAILURE, integerOption, stringOption, UsageError, type Io } from './args.ts';
import { listText, showText, summaryText } from './dlq-format.ts';
import { DATABASE_OPTIONS, withMailroom } from './open-mailroom.ts';
import { startProgress } from './progress.ts';
import { splitWords, type CommandValues, type CommandWithWords } from './subcommand.ts';

/** Exit code of a replay or discard stopped by SIGINT (128 + 2, as shells report it). */
export const EXIT_INTERRUPTED = 130;

type Subcommand = 'list' | 'show' | 'replay' | 'discard';
const SUBCOMMANDS: readonly Subcommand[] = ['list', 'show', 'replay', 'discard'];
const FILTERS = ['queue', 'type', 'category', 'since', 'until', 'text', 'id'];
/** Which options each subcommand takes (besides the database ones, --json and --help). */
const TAKES: Record<Subcommand, readonly string[]> = {
  list: [...FILTERS, 'limit', 'cursor'],
  show: [],
  replay: [...FILTERS, 'all', 'limit', 'rate', 'dry-run', 'by'],
  discard: [...FILTERS, 'all', 'dry-run', 'by'],
};
const EXAMPLES = 'e.g. mailroom dlq list --queue email --since 2h, mailroom dlq show ID, mailroom dlq replay --category transient --rate 10/s';
const RATE = /^(\d+(?:\.\d+)?)\s*\/\s*(s|m|h)$/;
const PER_SECOND: Record<string, number> = { s: 1, m: 60, h: 3600 };

/** `10/s`, `10/m`, `600/h` → jobs per second. */
export function parseRate(value: string): number {
  const match = RATE.exec(value.trim());
  const rate = match ? Number(match[1]) / PER_SECOND[match[2]!]! : Number.NaN;
  if (!(rate > 0) || rate > 100_000) {
    throw new UsageError(`mailroom dlq replay: --rate ${JSON.stringify(value)} is not a rate; expected N/s, N/m or N/h`, 'e.g. --rate 10/s, --rate 100/m or --rate 600/h (above 0); leave --rate out for no limit');
  }
  return rate;
}

/** Every `--id` given (repeated or comma-separated), in order. */
function idsFrom(args: string[]): string[] {
  const options = Object.fromEntries(Object.entries({ ...dlqCommand.options, ...COMMON_OPTIONS }).map(([name, o]) => [name, { type: o.type }]));
  const { tokens } = parseArgs({ args, strict: false, allowPositionals: true, tokens: true, options });
  return tokens.flatMap((t) => (t.kind === 'option' && t.name === 'id' && typeof t.value === 'string' ? t.value.split(',') : [])).map((id) => id.trim()).filter((id) => id !== '');
}

function parseDlqArgs(args: string[]): CommandValues {
  const { words, values } = splitWords(dlqCommand, args);
  if (values.help) return values;
  const [sub, ...rest] = words;
  if (sub === undefined) throw new UsageError('mailroom dlq: expected a subcommand: list, show, replay or discard', EXAMPLES);
  if (!(SUBCOMMANDS as readonly string[]).includes(sub)) {
    throw new UsageError(`mailroom dlq: unknown subcommand "${sub}"`, `dlq has: ${SUBCOMMANDS.join(', ')}; ${EXAMPLES}`);
  }
  const subcommand = sub as Subcommand;
  const prefix = `mailroom dlq ${subcommand}`;
  for (const name of [...FILTERS, 'all', 'limit', 'cursor', 'rate', 'dry-run', 'by']) {
    if (values[name] !== undefined && !TAKES[subcommand].includes(name)) {
      const where = SUBCOMMANDS.filter((s) => TAKES[s].includes(name));
      throw new UsageError(`${prefix}: --${name} does not apply here (it is for ${where.join(' and ')})`, `run \`mailroom help dlq\` to see which options each subcommand takes`);
    }
  }
  const ids = idsFrom(args);
  const bad = ids.find((id) => !isUuid(id));
  if (bad !== undefined) throw new UsageError(`${prefix}: --id ${JSON.stringify(bad)} is not a job id; a job id is a UUID such as 0193a2b4-6b1c-7d3e-8f00-4c2b9a1e5d77`, 'give --id once per job or a comma-separated list');
  if (subcommand === 'show') {
    if (rest.length !== 1) throw new UsageError(`${prefix}: expected one job id${rest.length > 1 ? `, got ${rest.length}` : ''}`, 'e.g. mailroom dlq show 0193a2b4-6b1c-7d3e-8f00-4c2b9a1e5d77');
    if (!isUuid(rest[0])) throw new UsageError(`${prefix}: ${JSON.stringify(rest[0])} is not a job id; a job id is a UUID such as 0193a2b4-6b1c-7d3e-8f00-4c2b9a1e5d77`, 'copy it from `mailroom dlq list`');
    return { ...values, subcommand, id: rest[0] };
  }
  if (rest.length > 0) throw new UsageError(`${prefix}: unexpected argument ${JSON.stringify(rest[0])}`, `select dead letters with options: --id ID (repeatable), --queue, --type, …; ${EXAMPLES}`);
  const parsed = { ...values, subcommand, id: undefined, ids: ids.length > 0 ? ids.join(',') : undefined };
  // Every usage mistake is found here, before a database is opened.
  if (subcommand === 'list') filterFrom(parsed, prefix);
  else actionOptions(subcommand, parsed);
  return parsed;
}

/** The filter the options describe, checked as the API checks it; mistakes are usage errors (exit 2). */
function filterFrom(values: CommandValues, prefix: string): DeadLetterFilter {
  const filter: DeadLetterFilter = {};
  for (const name of ['queue', 'type', 'category', 'text'] as const) {
    const value = stringOption(values[name]);
    if (value !== undefined) filter[name] = value;
  }
  for (const name of ['since', 'until'] as const) {
    const value = stringOption(values[name]);
    if (value === undefined) continue;
    try {
      filter[name] = parseTime(value, name);
    } catch {
      throw new UsageError(`${prefix}: --${name} ${JSON.stringify(value)} is not a time`, `give ${TIME_FORMS}`);
    }
  }
  const ids = stringOption(values.ids);
  if (ids !== undefined) filter.ids = ids.split(',');
  if (values.all === true) filter.all = true;
  try {
    resolveFilter(filter);
  } catch (error) {
    if (!(error instanceof ValidationError)) throw error;
    const field = error.issues[0]?.path ?? '';
    throw new UsageError(`${prefix}: ${error.message.replace(/^dead-letter filter: /, '')}`, field === 'since' || field === 'until' ? 'adjust --since / --until' : `check --${field}`);
  }
  return filter;
}

async function list(values: CommandValues, io: Io): Promise<number> {
  const filter = filterFrom(values, 'mailroom dlq list');
  const limit = integerOption(values.limit, 'limit', 50, 1, 1000);
  const cursor = stringOption(values.cursor);
  if (cursor !== undefined) {
    try {
      decodeCursor(cursor);
    } catch {
      throw new UsageError(`mailroom dlq list: --cursor ${JSON.stringify(cursor)} is not a cursor this command printed`, 'pass the cursor from the "More:" line (or "next" of --json) unchanged, or leave --cursor out for the first page');
    }
  }
  const { page, where } = await withMailroom(values, async (mailroom, at) => ({ page: await mailroom.deadLetters.list(filter, { limit, cursor: cursor ?? null }), where: at.where }));
  io.out.write(values.json ? `${JSON.stringify(page)}\n` : listText(page.items, page.next, where));
  return 0;
}

async function show(values: CommandValues, io: Io): Promise<number> {
  const id = stringOption(values.id)!;
  const { letter, state } = await withMailroom(values, async (mailroom) => {
    const letter = await mailroom.deadLetters.show(id);
    return { letter, state: letter ? 'dead' : (await mailroom.jobs.get(id))?.state };
  });
  if (!letter) {
    throw new Error(
      state === undefined
        ? `no dead letter with id ${id}: there is no such job; check the id, and --schema / --database if it is in another mailroom (dead letters are removed after their retention, 14 days by default)`
        : `job ${id} is not a dead letter (its state is ${state}); \`mailroom jobs get ${id}\` shows its history`,
    );
  }
  io.out.write(values.json ? `${JSON.stringify(letter)}\n` : showText(letter));
  return 0;
}

/** The filter and options of a replay or discard, or a UsageError. */
function actionOptions(action: 'replay' | 'discard', values: CommandValues) {
  const prefix = `mailroom dlq ${action}`;
  const filter = filterFrom(values, prefix);
  if (!hasCriterion(resolveFilter(filter)) && !filter.all) {
    throw new UsageError(
      `${prefix}: no filter given; refusing to ${action} every dead letter by accident`,
      `select with --queue, --type, --category, --since, --until, --text or --id, or pass --all to ${action} every dead letter (try --dry-run first)`,
    );
  }
  const rate = stringOption(values.rate) === undefined ? undefined : parseRate(stringOption(values.rate)!);
  const limit = values.limit === undefined ? undefined : integerOption(values.limit, 'limit', 0, 1, 1_000_000_000);
  const by = stringOption(values.by);
  if (by !== undefined && by.trim() === '') throw new UsageError(`${prefix}: --by needs a name, got an empty string`, 'e.g. --by alice@ops, or leave it out for user@host');
  return { prefix, filter, rate, limit, by: by ?? defaultActor(), dryRun: values['dry-run'] === true };
}

async function act(action: 'replay' | 'discard', values: CommandValues, io: Io): Promise<number> {
  const { prefix, filter, rate, limit, by, dryRun } = actionOptions(action, values);
  const controller = new AbortController();
  const onSigint = () => controller.abort();
  process.on('SIGINT', onSigint);
  let outcome: { result: ReplayResult | DiscardResult; where: string };
  try {
    outcome = await withMailroom(values, async (mailroom, at) => {
      let progress: ReturnType<typeof startProgress> | undefined;
      const onProgress = (p: { matched: number; done: number }) => {
        progress ??= startProgress(io.err, action, p.matched);
        progress.update(p.done);
      };
      try {
        const common = { dryRun, by, signal: controller.signal, onProgress };
        const result =
          action === 'replay'
            ? await mailroom.deadLetters.replay(filter, { ...common, ...(rate === undefined ? {} : { ratePerSecond: rate }), ...(limit === undefined ? {} : { limit }) })
            : await mailroom.deadLetters.discard(filter, common);
        return { result, where: at.where };
      } finally {
        progress?.finish();
      }
    });
  } finally {
    process.off('SIGINT', onSigint);
  }
  const { result, where } = outcome;
  io.out.write(values.json ? `${JSON.stringify({ action, by, ...result })}\n` : summaryText(action, result, by, where));
  if (result.interrupted) return EXIT_INTERRUPTED;
  if ((result.notFound ?? []).length > 0) {
    if (!values.json) io.err.write(`${prefix}: ${result.notFound!.length} of the ids given are not dead letters (no such job, or not dead); see "not found" above\n`);
    return EXIT_FAILURE;
  }
  return 0;
}

/** The `dlq` command. */
export const dlqCommand: CommandWithWords = {
  name: 'dlq',
  summary: 'the dead-letter queue: list, show, replay or discard dead letters by filter',
  usage:
    'mailroom dlq list [FILTERS] [--limit N] [--cursor C] | show ID | replay (FILTERS | --all) [--rate 10/s] [--limit N] [--dry-run] [--by NAME] | discard (FILTERS | --all) [--dry-run] [--by NAME]   [--database URL | --data-dir DIR] [--schema NAME] [--json]',
  options: {
    ...DATABASE_OPTIONS,
    queue: { type: 'string', value: 'NAME', description: "only this queue (a consumer group's is consumer.<group>)" },
    type: { type: 'string', value: 'TYPE', description: 'only this job type (or event type)' },
    category: { type: 'string', value: 'NAME', description: 'error category (permanent, validation, unknown-type, transient, …) or dead reason (max-attempts, max-age)' },
    since: { type: 'string', value: 'TIME', description: 'died at or after: ISO date/time, or a duration meaning ago (2h, 3d)' },
    until: { type: 'string', value: 'TIME', description: 'died at or before: same forms as --since' },
    text: { type: 'string', value: 'TEXT', description: 'the last error message contains TEXT (any case; % and _ are plain characters)' },
    id: { type: 'string', value: 'ID', description: 'only this job id; repeat it or give a comma-separated list' },
    all: { type: 'boolean', description: 'replay/discard: every dead letter (required when no filter is given)' },
    limit: { type: 'string', value: 'N', description: 'list: page size (default 50, at most 1000); replay: at most N jobs' },
    cursor: { type: 'string', value: 'C', description: 'list: the next page (printed after a full page)' },
    rate: { type: 'string', value: 'N/s', description: 'replay: at most this many jobs per second, minute or hour (10/s, 100/m, 600/h); default no limit' },
    'dry-run': { type: 'boolean', description: 'replay/discard: change nothing; show how many match' },
    by: { type: 'string', value: 'NAME', description: 'replay/discard: who does it, for the record (default user@host)' },
  },
  details:
    'FILTERS: --queue, --type, --category, --since, --until, --text, --id (each narrows the selection).\n' +
    'list: dead letters newest first, a page at a time (--limit, --cursor). show ID: one dead letter with\n' +
    'its errors, history and payload.\n' +
    'replay: puts the matching dead letters back in their queue in place (same id, history kept) with\n' +
    'fresh attempts, in small transactions, at most --rate per second; progress on stderr. discard: moves\n' +
    'them to cancelled (a job holding its ordering key lets the next one run). Each replay or discard,\n' +
    'dry runs too, is recorded with its filter, counts and --by. Ctrl-C stops after the batch in flight\n' +
    'and prints what was done: run the same command again for the rest (nothing is done twice).\n' +
    '\n' +
    'Exit codes: 0 done, 1 failed or some --id is not a dead letter (listed as not found),\n' +
    '2 bad usage (e.g. --rate ten, --since yesterday, replay without a filter or --all), 130 interrupted.',
  parse: parseDlqArgs,
  async run(values, io) {
    switch (values.subcommand as Subcommand) {
      case 'list':
        return list(values, io);
      case 'show':
        return show(values, io);
      case 'replay':
        return act('replay', values, io);
      case 'discard':
        return act('discard', values, io);
    }
  },
};
