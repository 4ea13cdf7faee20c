/**
 * `mailroom parked list|republish|discard`: the events relay targets refused
 * for good (`mailroom.parkedEvents`). Republishing needs the target itself,
 * so it takes it from the config file's relay, by name.
 */
import { INTERNAL_TARGET } from '../relay/internal-target.ts';
import { resolveRelayOptions } from '../relay/options.ts';
import type { ParkedEventRecord } from '../relay/parked-api.ts';
import type { RelayTarget } from '../relay/target.ts';
import { integerOption, UsageError, type Io } from './args.ts';
import { loadCommandConfig } from './command-config.ts';
import { formatTime, table } from './format.ts';
import { DATABASE_OPTIONS, withMailroom } from './open-mailroom.ts';
import { splitWords, type CommandValues, type CommandWithWords } from './subcommand.ts';

const SUBCOMMANDS = ['list', 'republish', 'discard'];
const HINT = 'e.g. mailroom parked list, mailroom parked republish nats:orders, mailroom parked discard nats:orders 0193a2b4-… (or --all)';

function parseParkedArgs(args: string[]): CommandValues {
  const { words, values } = splitWords(parkedCommand, args);
  if (values.help) return values;
  const [sub, target, ...ids] = words;
  if (sub === undefined) throw new UsageError(`mailroom parked: expected a subcommand: ${SUBCOMMANDS.join(', ')}`, HINT);
  if (!SUBCOMMANDS.includes(sub)) throw new UsageError(`mailroom parked: unknown subcommand "${sub}"`, `parked has: ${SUBCOMMANDS.join(', ')}; ${HINT}`);
  if (sub === 'list') {
    if (ids.length > 0) throw new UsageError(`mailroom parked list: expected at most one target name, got ${words.length - 1}: ${words.slice(1).join(' ')}`, HINT);
    if (values.all !== undefined) throw new UsageError('mailroom parked list: --all only applies to discard', HINT);
    return { ...values, subcommand: sub, target };
  }
  if (target === undefined) throw new UsageError(`mailroom parked ${sub}: expected the relay target's name (as status shows it, e.g. nats:orders)`, HINT);
  if (values.limit !== undefined) throw new UsageError(`mailroom parked ${sub}: --limit only applies to list`, HINT);
  if (sub === 'discard') {
    if (values.all && ids.length > 0) throw new UsageError('mailroom parked discard: give event ids or --all, not both', HINT);
    if (!values.all && ids.length === 0) {
      throw new UsageError(`mailroom parked discard: say which parked events of ${target} to delete: their event ids, or --all`, 'see them with mailroom parked list');
    }
  } else if (values.all !== undefined) {
    throw new UsageError('mailroom parked republish: --all only applies to discard (republish takes every parked event of the target when no id is given)', HINT);
  }
  return { ...values, subcommand: sub, target, ids: ids.join(' ') };
}

function listText(items: ParkedEventRecord[], limit: number): string {
  if (items.length === 0) return 'No parked events.\n';
  let out = table(
    [{ heading: 'target' }, { heading: 'position', right: true }, { heading: 'event id' }, { heading: 'type' }, { heading: 'bytes', right: true }, { heading: 'parked' }, { heading: 'reason' }],
    items.map((p) => [p.target, p.position, p.eventId, p.type, String(p.bytes), formatTime(p.parkedAt), p.reason.replace(/\s+/g, ' ')]),
  );
  if (items.length >= limit) out += `(the first ${limit}; --limit N to see more)\n`;
  return out;
}

/** The relay target named `name` in the config file, to publish through. */
async function configTarget(values: CommandValues, name: string): Promise<RelayTarget> {
  const loaded = await loadCommandConfig(values, true);
  const relay = loaded!.config.relay;
  const internal: RelayTarget = { name: INTERNAL_TARGET, publish: async () => {} };
  const targets = relay === undefined || relay === false ? [] : resolveRelayOptions(relay, internal).targets.filter((t) => t !== internal);
  const target = targets.find((t) => t.name === name);
  if (!target) {
    const names = targets.map((t) => t.name);
    throw new UsageError(
      `mailroom parked republish: the relay of ${loaded!.display} has no target named ${JSON.stringify(name)}`,
      names.length > 0 ? `its targets: ${names.join(', ')}` : 'republishing needs the config file whose relay has that target (--config PATH)',
    );
  }
  return target;
}

async function republish(values: CommandValues, io: Io, name: string, ids: string[] | undefined): Promise<number> {
  const target = await configTarget(values, name);
  try {
    const result = await withMailroom(values, (mailroom) => mailroom.parkedEvents.republish(target, { eventIds: ids }));
    if (values.json) io.out.write(`${JSON.stringify(result)}\n`);
    else {
      io.out.write(`Republished ${result.republished.length} parked event${result.republished.length === 1 ? '' : 's'} to ${name}.\n`);
      for (const r of result.refused) io.out.write(`Refused again, still parked: ${r.eventId}: ${r.reason}\n`);
    }
    return result.refused.length > 0 ? 1 : 0;
  } finally {
    await target.close?.();
  }
}

/** The `parked` command. */
export const parkedCommand: CommandWithWords = {
  name: 'parked',
  summary: 'events relay targets refused for good: list them, republish them once fixed, or discard them',
  usage: 'mailroom parked list [TARGET] [--limit N] | republish TARGET [ID...] | discard TARGET (ID... | --all) [--database URL | --data-dir DIR] [--schema NAME] [--config PATH] [--json]',
  options: {
    ...DATABASE_OPTIONS,
    limit: { type: 'string', value: 'N', description: 'list: at most N events (default 100)' },
    all: { type: 'boolean', description: 'discard: every parked event of the target' },
  },
  details:
    'A relay target refuses an event for good when the broker can never take it as it is (larger than\n' +
    "NATS's max_payload or RabbitMQ's max_message_size, say); the relay parks it and goes on\n" +
    '(docs/EVENTS.md, "Events a target refuses").\n' +
    '\n' +
    'parked list [TARGET]: position, event id, type, size, when and why, oldest first per target.\n' +
    'parked republish TARGET [ID...]: once the cause is fixed, publishes the target\'s parked events (all,\n' +
    'or the ids given) again, one at a time in outbox order, through the target of that name in the config\n' +
    "file's relay (--config PATH, or mailroom.config.* here); each one taken is no longer parked.\n" +
    'parked discard TARGET ID... | --all: deletes parked events without publishing them.\n' +
    '\n' +
    'Exit codes: 0 done, 1 an event was refused again (it stays parked) or the database or broker could\n' +
    'not be reached, 2 bad usage.',
  parse: parseParkedArgs,
  async run(values, io) {
    const target = typeof values.target === 'string' ? values.target : undefined;
    const ids = typeof values.ids === 'string' && values.ids !== '' ? values.ids.split(' ') : undefined;
    if (values.subcommand === 'list') {
      const limit = integerOption(values.limit, 'limit', 100, 1, 10_000);
      const items = await withMailroom(values, (mailroom) => mailroom.parkedEvents.list({ target, limit }));
      io.out.write(values.json ? `${JSON.stringify(items)}\n` : listText(items, limit));
      return 0;
    }
    if (values.subcommand === 'republish') return republish(values, io, target!, ids);
    const { discarded } = await withMailroom(values, (mailroom) => mailroom.parkedEvents.discard(target!, ids ? { eventIds: ids } : { all: true }));
    io.out.write(values.json ? `${JSON.stringify({ discarded })}\n` : `Discarded ${discarded.length} parked event${discarded.length === 1 ? '' : 's'} of ${target}.\n`);
    return 0;
  },
};
