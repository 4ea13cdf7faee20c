/**
 * `mailroom groups remove GROUP`: retires a consumer group that no longer runs
 * (`mailroom.consumerGroups.remove`).
 */
import { assertGroupName } from '../consumers/options.ts';
import { UsageError } from './args.ts';
import { DATABASE_OPTIONS, withMailroom } from './open-mailroom.ts';
import { splitWords, type CommandValues, type CommandWithWords } from './subcommand.ts';

const HINT = 'e.g. mailroom groups remove billing-v1 (status lists the groups)';

function parseGroupsArgs(args: string[]): CommandValues {
  const { words, values } = splitWords(groupsCommand, args);
  if (values.help) return values;
  const [sub, group, ...rest] = words;
  if (sub === undefined) throw new UsageError('mailroom groups: expected a subcommand: remove', HINT);
  if (sub !== 'remove') throw new UsageError(`mailroom groups: unknown subcommand "${sub}"`, `groups has: remove; ${HINT}`);
  if (group === undefined) throw new UsageError('mailroom groups remove: expected the name of the group to remove', HINT);
  if (rest.length > 0) throw new UsageError(`mailroom groups remove: expected one group name, got ${words.length - 1}: ${words.slice(1).join(' ')}`, HINT);
  try {
    assertGroupName(group, 'mailroom groups remove');
  } catch (error) {
    throw new UsageError((error as Error).message, HINT);
  }
  return { ...values, subcommand: sub, group };
}

/** The `groups` command. */
export const groupsCommand: CommandWithWords = {
  name: 'groups',
  summary: 'consumer groups: remove one that no longer runs',
  usage: 'mailroom groups remove GROUP [--database URL | --data-dir DIR] [--schema NAME] [--json]',
  options: { ...DATABASE_OPTIONS },
  details:
    'groups remove GROUP: retires a consumer group whose code is gone. Its subscription is deleted, so\n' +
    'the fan-out makes no more jobs for it; its waiting jobs (and running ones whose lease expired) are\n' +
    'cancelled and its inbox keys deleted; its completed and dead jobs stay. Refused while a job of the\n' +
    'group runs under a live lease: stop every consumer of it first (docs/EVENTS.md, "Removing a group").\n' +
    '\n' +
    'Exit codes: 0 removed, 1 no such group, a consumer of it still runs, or the database could not be\n' +
    'reached, 2 bad usage.',
  parse: parseGroupsArgs,
  async run(values, io) {
    const group = String(values.group);
    const result = await withMailroom(values, (mailroom) => mailroom.consumerGroups.remove(group));
    if (values.json) io.out.write(`${JSON.stringify(result)}\n`);
    else if (!result.removed) io.err.write(`mailroom groups remove: no consumer group named ${group} is registered (mailroom status lists them)\n`);
    else {
      io.out.write(
        `Removed consumer group ${group}: ${result.cancelledJobs} job${result.cancelledJobs === 1 ? '' : 's'} cancelled, ${result.inboxKeys} inbox key${result.inboxKeys === 1 ? '' : 's'} deleted.\n`,
      );
    }
    return result.removed ? 0 : 1;
  },
};
