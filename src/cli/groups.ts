/**
 * `mailroom groups remove GROUP`: retires a consumer group that no longer runs
 * (`mailroom.consumerGroups.remove`).
 */
import { assertGroupName } from '../consumers/options.ts';
import { UsageError } from './args.ts';
import { DATABASE_OPTIONS, withMailroom } from './open-mailroom.ts';
import { loadCommandConfig } from './command-config.ts';
import type { ConsumerSource } from '../brokers/source.ts';
import { parseRemoveArgs, type CommandValues, type CommandWithWords } from './subcommand.ts';

const HINT = 'e.g. mailroom groups remove billing-v1 (status lists the groups)';

/** The `groups` command. */
export const groupsCommand: CommandWithWords = {
  name: 'groups',
  summary: 'consumer groups: remove one that no longer runs',
  usage: 'mailroom groups remove GROUP [--broker] [--database URL | --data-dir DIR] [--schema NAME] [--config PATH] [--json]',
  options: {
    ...DATABASE_OPTIONS,
    broker: { type: 'boolean', description: "also delete what the broker keeps for the group (the source of that group in the config file's consumers)" },
  },
  details:
    'groups remove GROUP: retires a consumer group whose code is gone. Its subscription is deleted, so\n' +
    'the fan-out makes no more jobs for it; its waiting jobs (and running ones whose lease expired) are\n' +
    'cancelled and its inbox keys deleted; its completed and dead jobs stay. Refused while a job of the\n' +
    'group runs under a live lease: stop every consumer of it first (docs/EVENTS.md, "Removing a group").\n' +
    'With --broker, the source of that group in the config file (--config PATH, or mailroom.config.* here)\n' +
    'also deletes what the broker keeps for it: the RabbitMQ queue, the NATS durable consumer, the Redis\n' +
    'stream group, with the messages not yet taken.\n' +
    '\n' +
    'Exit codes: 0 removed, 1 no such group registered (with --broker the broker part runs all the same),\n' +
    'a consumer of it still runs, the broker part failed, or the database could not be reached; 2 bad usage.',
  parse: (args) => parseRemoveArgs(groupsCommand, args, { noun: 'group', value: 'group', hint: HINT, check: (group) => assertGroupName(group, 'mailroom groups remove') }),
  async run(values, io) {
    const group = String(values.group);
    const source = values.broker === true ? await configSource(values, group) : undefined;
    const result = await withMailroom(values, (mailroom) => mailroom.consumerGroups.remove(group, { source }));
    if (values.json) io.out.write(`${JSON.stringify(result)}\n`);
    else if (!result.removed) io.err.write(`mailroom groups remove: no consumer group named ${group} is registered (mailroom status lists them)\n`);
    else {
      io.out.write(
        `Removed consumer group ${group}: ${result.cancelledJobs} job${result.cancelledJobs === 1 ? '' : 's'} cancelled, ${result.inboxKeys} inbox key${result.inboxKeys === 1 ? '' : 's'} deleted.\n`,
      );
    }
    if (!values.json && result.broker !== null) io.out.write(`Broker: ${result.broker}.\n`);
    return result.removed ? 0 : 1;
  },
};

/** The broker source of `group` among the config file's consumers (for --broker). */
async function configSource(values: CommandValues, group: string): Promise<ConsumerSource> {
  const loaded = (await loadCommandConfig(values, true))!;
  const consumers = loaded.config.consumers ?? [];
  const match = consumers.find((c) => c.group === group);
  if (match?.source === undefined) {
    const withSources = consumers.filter((c) => c.source !== undefined).map((c) => c.group);
    throw new UsageError(
      `mailroom groups remove --broker: ${loaded.display} has no consumer of group ${group} with a broker source`,
      withSources.length > 0 ? `its groups with a source: ${withSources.join(', ')}` : 'drop --broker, or point --config at the file whose consumers read that group from a broker',
    );
  }
  return match.source;
}
