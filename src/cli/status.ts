/**
 * `mailroom status`: the health numbers of `mailroom.stats()` per queue,
 * relay target and consumer group; with `--check`, a verdict in the exit code
 * (0 healthy, 3 a threshold crossed).
 */
import { toMilliseconds } from '../duration.ts';
import type { HeldBackBy } from '../relay/held-back.ts';
import type { MailroomStats } from '../stats.ts';
import { integerOption, stringOption, UsageError, type CommandSpec } from './args.ts';
import { formatAge, formatRate, table } from './format.ts';
import { checkHealth, DEFAULT_THRESHOLDS, type FailedCheck, type HealthThresholds } from './health.ts';
import { DATABASE_OPTIONS, withMailroom } from './open-mailroom.ts';

/** Exit code of `status --check` when a threshold is crossed. */
export const EXIT_UNHEALTHY = 3;

function durationOption(value: string | boolean | undefined, name: string, fallback: string): number {
  const text = stringOption(value) ?? fallback;
  try {
    return toMilliseconds(text, `--${name}`) / 1000;
  } catch {
    throw new UsageError(`option --${name}: expected a duration such as 30s, 5m or 2h, got ${JSON.stringify(text)}`, `e.g. --${name} ${fallback}`);
  }
}

function thresholds(values: Record<string, string | boolean | undefined>): HealthThresholds | undefined {
  const given = ['max-age', 'max-dead', 'max-lag'].filter((name) => values[name] !== undefined);
  if (!values.check) {
    if (given.length > 0) throw new UsageError(`option --${given[0]} only applies with --check`, `add --check to have the exit code say whether mailroom is healthy`);
    return undefined;
  }
  return {
    maxAgeSeconds: durationOption(values['max-age'], 'max-age', DEFAULT_THRESHOLDS.maxAge),
    maxDead: integerOption(values['max-dead'], 'max-dead', DEFAULT_THRESHOLDS.maxDead, 0, 1_000_000_000),
    maxLagSeconds: durationOption(values['max-lag'], 'max-lag', DEFAULT_THRESHOLDS.maxLag),
  };
}

function heldBack(by: HeldBackBy | null): string {
  if (by === null) return '-';
  if (by.pid === null) return `a transaction not visible here (xid ${by.xid})`;
  const parts = [by.ageSeconds === null ? undefined : `open ${formatAge(by.ageSeconds)}`, by.applicationName ?? undefined, by.database ? `db ${by.database}` : undefined];
  return `pid ${by.pid} (${parts.filter((p) => p !== undefined).join(', ')})`;
}

/** The human report: one table per section. */
export function statusText(stats: MailroomStats, where: string): string {
  let out = `mailroom status: ${where}\n\n`;
  const queues = Object.entries(stats.queues).sort(([a], [b]) => a.localeCompare(b));
  out += 'Queues\n';
  out +=
    queues.length === 0
      ? '  no jobs waiting, running or dead\n'
      : table(
          [
            { heading: 'queue' },
            { heading: 'available', right: true },
            { heading: 'scheduled', right: true },
            { heading: 'retrying', right: true },
            { heading: 'blocked', right: true },
            { heading: 'active', right: true },
            { heading: 'dead', right: true },
            { heading: 'oldest', right: true },
            { heading: 'completed/s', right: true },
            { heading: 'failed/s', right: true },
          ],
          queues.map(([name, q]) => [
            name,
            String(q.available),
            String(q.scheduled),
            String(q.retrying),
            String(q.blocked),
            String(q.active),
            String(q.dead),
            formatAge(q.oldestAgeSeconds),
            formatRate(q.completedPerSecond),
            formatRate(q.failedPerSecond),
          ]),
        );
  const targets = Object.entries(stats.relay).sort(([a], [b]) => a.localeCompare(b));
  out += '\nRelay targets\n';
  out +=
    targets.length === 0
      ? '  none (no relay has run on this schema)\n'
      : table(
          [{ heading: 'target' }, { heading: 'unpublished', right: true }, { heading: 'lag', right: true }, { heading: 'parked', right: true }, { heading: 'held back by' }, { heading: 'relay' }],
          targets.map(([name, r]) => [name, String(r.unpublished), formatAge(r.lagSeconds), String(r.parked), heldBack(r.heldBackBy), r.holder ?? 'none running']),
        );
  const groups = Object.entries(stats.consumers).sort(([a], [b]) => a.localeCompare(b));
  out += '\nConsumer groups\n';
  out +=
    groups.length === 0
      ? '  none\n'
      : table(
          [
            { heading: 'group' },
            { heading: 'lag', right: true },
            { heading: 'unrelayed', right: true },
            { heading: 'unfinished', right: true },
            { heading: 'dead', right: true },
            { heading: 'duplicates rejected', right: true },
            { heading: 'source' },
          ],
          groups.map(([name, g]) => [name, String(g.lag), String(g.unrelayed), String(g.unfinished), String(g.dead), String(g.duplicatesRejected), g.source ?? 'relay']),
        );
  return out;
}

function verdictText(failed: readonly FailedCheck[], limits: HealthThresholds): string {
  const checked = `oldest waiting job at most ${formatAge(limits.maxAgeSeconds)}, at most ${limits.maxDead} dead letters per queue (parked events per relay target), relay and consumer lag at most ${formatAge(limits.maxLagSeconds)}`;
  if (failed.length === 0) return `\nHealthy: ${checked}.\n`;
  return `\nUnhealthy: ${failed.length} check${failed.length === 1 ? '' : 's'} failed (${checked}):\n${failed.map((f) => `  ${f.message}\n`).join('')}`;
}

/** The `status` command. */
export const statusCommand: CommandSpec = {
  name: 'status',
  summary: 'health per queue, relay target and consumer group; --check for a scriptable verdict',
  usage: 'mailroom status [--database URL | --data-dir DIR] [--schema NAME] [--check [--max-age 5m] [--max-dead 0] [--max-lag 60s]] [--json]',
  options: {
    ...DATABASE_OPTIONS,
    check: { type: 'boolean', description: 'exit 3 when a threshold below is crossed (0 when healthy), naming each failed check' },
    'max-age': { type: 'string', value: 'DURATION', description: `with --check: longest a job may wait once due, in any queue (default ${DEFAULT_THRESHOLDS.maxAge})` },
    'max-dead': { type: 'string', value: 'N', description: `with --check: most dead letters allowed in any one queue, and parked events in any one relay target (default ${DEFAULT_THRESHOLDS.maxDead})` },
    'max-lag': {
      type: 'string',
      value: 'DURATION',
      description: `with --check: longest an event may wait for a relay target or consumer group (default ${DEFAULT_THRESHOLDS.maxLag})`,
    },
  },
  details:
    'Queues: jobs available (due now), scheduled, retrying, blocked (behind an earlier job of their ordering\n' +
    'key), active and dead; how long the oldest available job has been due; completions and failed attempts\n' +
    'per second over the last minute. Relay targets: events not yet published, the age of the oldest, events\n' +
    'the target refused for good (parked in relay_parked), and the open transaction holding the relay back.\n' +
    'Consumer groups: lag (events not yet relayed to the group plus its unfinished jobs), dead letters, and\n' +
    'redeliveries its inbox rejected. Numbers come from the database, so they count the work of every process.\n' +
    '\n' +
    '--json prints the mailroom.stats() object (with --check, plus "health": { ok, thresholds, failed }).\n' +
    '\n' +
    'Exit codes: 0 done (with --check: healthy), 1 the database could not be read, 2 bad usage,\n' +
    '3 (--check only) a threshold was crossed; each failed check is printed.',
  async run(values, io) {
    const limits = thresholds(values);
    const { stats, where } = await withMailroom(values, async (mailroom, at) => ({ stats: await mailroom.stats(), where: at.where }));
    const failed = limits ? checkHealth(stats, limits) : [];
    if (values.json) {
      const health = limits ? { health: { ok: failed.length === 0, thresholds: limits, failed } } : {};
      io.out.write(`${JSON.stringify({ ...stats, ...health })}\n`);
    } else {
      io.out.write(statusText(stats, where));
      if (limits) io.out.write(verdictText(failed, limits));
    }
    return failed.length > 0 ? EXIT_UNHEALTHY : 0;
  },
};
