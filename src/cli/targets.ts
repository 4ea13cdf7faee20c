/**
 * `mailroom targets remove TARGET`: retires a relay target no relay runs any
 * more (`mailroom.relayTargets.remove`), so its cursor stops holding outbox
 * retention back.
 */
import { DATABASE_OPTIONS, withMailroom } from './open-mailroom.ts';
import { parseRemoveArgs, type CommandWithWords } from './subcommand.ts';

const HINT = 'e.g. mailroom targets remove rabbitmq:orders-old (status lists the targets)';

/** The `targets` command. */
export const targetsCommand: CommandWithWords = {
  name: 'targets',
  summary: 'relay targets: remove one that no relay runs any more',
  usage: 'mailroom targets remove TARGET [--database URL | --data-dir DIR] [--schema NAME] [--config PATH] [--json]',
  options: DATABASE_OPTIONS,
  details:
    'targets remove TARGET: retires a relay target whose relay is gone. A target keeps a cursor in the\n' +
    'database, and the outbox keeps every event until all cursors have passed it, so a target no relay\n' +
    'runs holds retention back for good. Its cursor and the events parked for it are deleted. Refused\n' +
    'while a relay holds the target, and for `internal` while groups of internal events exist.\n' +
    'A relay that runs the target later starts it at the oldest event the outbox keeps.\n' +
    '\n' +
    'Exit codes: 0 removed, 1 no such target, a relay still runs it, or the database could not be\n' +
    'reached; 2 bad usage.',
  parse: (args) => parseRemoveArgs(targetsCommand, args, { noun: 'target', value: 'target', hint: HINT }),
  async run(values, io) {
    const target = String(values.target);
    const result = await withMailroom(values, (mailroom) => mailroom.relayTargets.remove(target));
    if (values.json) io.out.write(`${JSON.stringify({ target, ...result })}\n`);
    else if (!result.removed) io.err.write(`mailroom targets remove: no relay target named ${target} has a cursor (mailroom status lists them)\n`);
    else io.out.write(`Removed relay target ${target}${result.parked > 0 ? ` and its ${result.parked} parked event${result.parked === 1 ? '' : 's'}` : ''}.\n`);
    return result.removed ? 0 : 1;
  },
};
