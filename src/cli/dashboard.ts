/**
 * `mailroom dashboard`: serves the web dashboard (queues, relay and consumer
 * lag, job histories, the dead-letter queue) until SIGINT or SIGTERM.
 */
import { createDashboard } from '../dashboard/server.ts';
import { DASHBOARD_TOKEN_RULE, dashboardTokenProblem } from '../dashboard/options.ts';
import { integerOption, stringOption, UsageError, type CommandSpec, type Io } from './args.ts';
import { DATABASE_OPTIONS, withMailroom } from './open-mailroom.ts';

const DEFAULT_PORT = 4000;

/** Resolves on the first SIGINT or SIGTERM. */
function stopRequested(): Promise<NodeJS.Signals> {
  return new Promise((resolve) => {
    const on = (signal: NodeJS.Signals) => {
      process.off('SIGINT', on);
      process.off('SIGTERM', on);
      resolve(signal);
    };
    process.on('SIGINT', on);
    process.on('SIGTERM', on);
  });
}

/** $MAILROOM_DASHBOARD_TOKEN (unset or empty: undefined); a bad one is a usage mistake naming the variable, before the database is opened. */
export function tokenFromEnvironment(): string | undefined {
  const token = process.env.MAILROOM_DASHBOARD_TOKEN || undefined;
  const problem = token === undefined ? undefined : dashboardTokenProblem(token);
  if (problem !== undefined) {
    throw new UsageError(`MAILROOM_DASHBOARD_TOKEN ${DASHBOARD_TOKEN_RULE}; ${problem}`, 'export MAILROOM_DASHBOARD_TOKEN=$(openssl rand -hex 24), or unset it for a generated token');
  }
  return token;
}

/** The `dashboard` command. */
export const dashboardCommand: CommandSpec = {
  name: 'dashboard',
  summary: 'serve the web dashboard: queues, lag, job histories, the dead-letter queue',
  usage: 'mailroom dashboard [--port PORT] [--host HOST] [--read-only] [--database URL | --data-dir DIR] [--schema NAME] [--config PATH] [--json]',
  options: {
    ...DATABASE_OPTIONS,
    port: { type: 'string', value: 'PORT', description: `port to listen on (default ${DEFAULT_PORT}; 0 picks a free one)` },
    host: { type: 'string', value: 'HOST', description: 'address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)' },
    'read-only': { type: 'boolean', description: 'show everything, change nothing (replay and discard are turned off)' },
  },
  details:
    'The token: $MAILROOM_DASHBOARD_TOKEN (at least 16 characters), else a random one, printed in the\n' +
    'address to open (http://host:port/#token=…). Every API request carries it as a bearer token, never\n' +
    "as a cookie; actions must come from the dashboard's own page. Payload fields named in the config's\n" +
    '`redact` are hidden. Runs until SIGINT or SIGTERM (docs/OPERATIONS.md, "The dashboard").\n' +
    '\n' +
    'Exit codes: 0 stopped by a signal, 1 the port is taken or the database could not be reached, 2 bad usage.',
  async run(values, io: Io) {
    const port = values.port === undefined ? DEFAULT_PORT : integerOption(values.port, 'port', DEFAULT_PORT, 0, 65_535);
    const host = stringOption(values.host) ?? '127.0.0.1';
    const token = tokenFromEnvironment();
    await withMailroom(values, async (mailroom, at) => {
      const dashboard = createDashboard(mailroom, { token, readOnly: values['read-only'] === true });
      const { url, close } = await dashboard.listen(port, host);
      if (values.json) io.out.write(`${JSON.stringify({ event: 'listening', url, readOnly: dashboard.readOnly, where: at.where })}\n`);
      else io.out.write(`mailroom dashboard: ${at.where}${dashboard.readOnly ? ', read-only' : ''}\nOpen ${url}\n`);
      const signal = await stopRequested();
      await close();
      if (values.json) io.out.write(`${JSON.stringify({ event: 'stopped', signal })}\n`);
      else io.out.write(`mailroom dashboard: stopped (${signal})\n`);
    });
    return 0;
  },
};
