/**
 * `mailroom jobs get ID`: one job's full history; `mailroom jobs get
 * --correlation ID`: every job and event one request caused.
 */
import { isUuid } from '../ids.ts';
import { CORRELATION_LIMIT, type CorrelationTrail, type JobSummary, type OutboxEventSummary } from '../jobs/correlation.ts';
import type { JobInfo } from '../jobs/get.ts';
import { integerOption, stringOption, UsageError, type CommandSpec } from './args.ts';
import { formatTime, table } from './format.ts';
import { DATABASE_OPTIONS, withMailroom } from './open-mailroom.ts';
import { splitWords, type CommandValues, type CommandWithWords } from './subcommand.ts';

const SUBCOMMANDS = ['get'];

/** `dead (sent to support)`; just `completed` when the status says no more than the state. */
function stateText(state: string, status: string): string {
  return status === state ? state : `${state} (${status})`;
}

function field(label: string, value: string | null | undefined): string {
  return value === null || value === undefined || value === '' ? '' : `  ${label.padEnd(16)}${value}\n`;
}

/** A job's full history for people. */
export function jobText(job: JobInfo): string {
  let out = `Job ${job.id}\n`;
  out += field('type', job.type);
  out += field('queue', job.queue);
  out += field('state', stateText(job.state, job.status));
  out += field('attempts', `${job.attempts} of ${job.maxAttempts}`);
  out += field('last error', job.lastError ? `${job.lastError.category}: ${job.lastError.message}` : null);
  out += field('dead reason', job.deadReason);
  out += field('key', job.key);
  out += field('ordering key', job.orderingKey);
  out += field('correlation id', job.correlationId);
  out += field('priority', job.priority === 0 ? null : String(job.priority));
  out += field('created', formatTime(job.createdAt));
  out += field('next run', job.nextRunAt ? formatTime(job.nextRunAt) : null);
  out += field('started', job.startedAt ? formatTime(job.startedAt) : null);
  out += field('finished', job.finishedAt ? formatTime(job.finishedAt) : null);
  if (job.state === 'active') out += field('running on', `${job.lockedBy ?? 'unknown worker'}, lease until ${formatTime(job.lockedUntil)}`);
  out += '\nHistory\n';
  out += table(
    [{ heading: 'at' }, { heading: 'event' }, { heading: 'attempt', right: true }, { heading: 'worker' }, { heading: 'detail' }],
    job.history.map((h) => [formatTime(h.at), h.event, h.attempt === undefined ? '' : String(h.attempt), h.worker ?? '', h.detail ?? '']),
  );
  out += `\nErrors${job.errors.length === 0 ? ': none\n' : '\n'}`;
  if (job.errors.length > 0) {
    out += table(
      [{ heading: 'attempt', right: true }, { heading: 'at' }, { heading: 'category' }, { heading: 'worker' }, { heading: 'message' }],
      job.errors.map((e) => [String(e.attempt), formatTime(e.at), e.category, e.worker ?? '', e.message.replace(/\s+/g, ' ')]),
    );
  }
  const payload = JSON.stringify(job.data, null, 2) ?? 'null';
  out += `\nPayload\n${payload.replace(/^/gm, '  ')}\n`;
  return out;
}

type TrailItem = JobSummary | OutboxEventSummary;

function jobDetail(job: JobSummary): string {
  const where = job.consumerGroup ? `consumer group ${job.consumerGroup} (queue ${job.queue})` : `queue ${job.queue}`;
  const from = job.eventId ? `, from event ${job.eventId}` : '';
  const error = job.lastError && job.state !== 'completed' ? `, last error ${job.lastError.category}: ${job.lastError.message.replace(/\s+/g, ' ')}` : '';
  return `${where}, ${stateText(job.state, job.status)}, attempt ${job.attempts} of ${job.maxAttempts}${from}${error}`;
}

function eventDetail(event: OutboxEventSummary): string {
  const parts = [event.key === null ? undefined : `key ${event.key}`];
  parts.push(event.publishedTo.length > 0 ? `published to ${event.publishedTo.join(', ')}` : 'not published yet');
  if (event.pendingTo.length > 0 && event.publishedTo.length > 0) parts.push(`waiting for ${event.pendingTo.join(', ')}`);
  if (event.causationId !== null) parts.push(`caused by ${event.causationId}`);
  return parts.filter((p) => p !== undefined).join(', ');
}

/** Everything one request caused, for people: one line each, oldest first. */
export function trailText(correlationId: string, trail: CorrelationTrail, limit: number): string {
  const items: TrailItem[] = [...trail.events, ...trail.jobs].sort((a, b) => a.createdAt.getTime() - b.createdAt.getTime());
  const count = (n: number, what: string) => `${n} ${what}${n === 1 ? '' : 's'}`;
  let out = `Correlation id ${correlationId}: ${count(trail.jobs.length, 'job')}, ${count(trail.events.length, 'event')}, oldest first\n`;
  out += table(
    [{ heading: 'time' }, { heading: 'kind' }, { heading: 'type' }, { heading: 'id' }, { heading: 'where and how' }],
    items.map((item) => [formatTime(item.createdAt), item.kind, item.type, item.id, item.kind === 'job' ? jobDetail(item) : eventDetail(item)]),
  );
  if (trail.jobs.length >= limit || trail.events.length >= limit) out += `(the first ${limit} of each kind; --limit N to see more)\n`;
  return out;
}

function parseJobsArgs(args: string[]): CommandValues {
  const { words, values } = splitWords(jobsCommand, args);
  if (values.help) return values;
  const [sub, ...rest] = words;
  const hint = 'e.g. mailroom jobs get 0193a2b4-…, or mailroom jobs get --correlation req-42';
  if (sub === undefined) throw new UsageError('mailroom jobs: expected a subcommand: get', hint);
  if (!SUBCOMMANDS.includes(sub)) throw new UsageError(`mailroom jobs: unknown subcommand "${sub}"`, `jobs has: ${SUBCOMMANDS.join(', ')}; ${hint}`);
  const correlation = stringOption(values.correlation);
  if (correlation !== undefined) {
    if (rest.length > 0) {
      throw new UsageError(`mailroom jobs get: give a job id or --correlation, not both (got ${JSON.stringify(rest[0])} and --correlation)`, hint);
    }
    if (correlation.trim() === '') throw new UsageError('mailroom jobs get: --correlation needs a correlation id, got an empty string', hint);
    return { ...values, subcommand: sub };
  }
  if (values.limit !== undefined) throw new UsageError('mailroom jobs get: --limit only applies with --correlation', hint);
  if (rest.length === 0) throw new UsageError('mailroom jobs get: expected a job id (or --correlation ID)', hint);
  if (rest.length > 1) throw new UsageError(`mailroom jobs get: expected one job id, got ${rest.length}: ${rest.join(' ')}`, 'look up one job at a time');
  const id = rest[0]!;
  if (!isUuid(id)) {
    throw new UsageError(
      `mailroom jobs get: ${JSON.stringify(id)} is not a job id; a job id is a UUID such as 0193a2b4-6b1c-7d3e-8f00-4c2b9a1e5d77`,
      'copy the id enqueue() returned or a log line shows; to follow a request by its correlation id, use --correlation ID',
    );
  }
  return { ...values, subcommand: sub, id };
}

/** The `jobs` command. */
export const jobsCommand: CommandWithWords = {
  name: 'jobs',
  summary: "a job's full history (jobs get ID), or everything one request caused (jobs get --correlation ID)",
  usage: 'mailroom jobs get ID | --correlation ID [--limit N] [--database URL | --data-dir DIR] [--schema NAME] [--json]',
  options: {
    ...DATABASE_OPTIONS,
    correlation: { type: 'string', value: 'ID', description: 'list every job and event with this correlation id instead of one job' },
    limit: { type: 'string', value: 'N', description: `with --correlation: at most N jobs and N events (default ${CORRELATION_LIMIT.default})` },
  },
  details:
    'jobs get ID: state, status, attempts, last error, every failed attempt (time, category, worker,\n' +
    'message), the history line by line, and the payload (with the redact fields of the config file,\n' +
    '--config or mailroom.config.* here, hidden).\n' +
    '--json prints the JobInfo of mailroom.jobs.get(id).\n' +
    '\n' +
    'jobs get --correlation ID: the jobs (consumer groups\' included) and outbox events carrying that\n' +
    'correlation id, oldest first, one line each: time written, kind, type, id, and the queue and state of\n' +
    'a job or the relay targets an event was published to. --json prints mailroom.jobs.byCorrelation().\n' +
    '\n' +
    'Exit codes: 0 found, 1 no such job (or nothing with that correlation id) or the database could not be\n' +
    'read, 2 bad usage (e.g. an id that is not a UUID).',
  parse: parseJobsArgs,
  async run(values, io) {
    const correlation = stringOption(values.correlation);
    if (correlation !== undefined) {
      const limit = integerOption(values.limit, 'limit', CORRELATION_LIMIT.default, 1, CORRELATION_LIMIT.max);
      const trail = await withMailroom(values, (mailroom) => mailroom.jobs.byCorrelation(correlation, { limit }));
      if (trail.jobs.length === 0 && trail.events.length === 0) {
        throw new Error(`no jobs or events with correlation id ${JSON.stringify(correlation)}; check the id, and --schema / --database if it was recorded elsewhere`);
      }
      io.out.write(values.json ? `${JSON.stringify(trail)}\n` : trailText(correlation, trail, limit));
      return 0;
    }
    const id = stringOption(values.id)!;
    const job = await withMailroom(values, (mailroom) => mailroom.jobs.get(id));
    if (job === undefined) {
      throw new Error(
        `no job with id ${id}; check the id, and --schema / --database if it is in another mailroom (finished jobs are removed after their retention: 7 days for completed, 14 for dead by default)`,
      );
    }
    io.out.write(values.json ? `${JSON.stringify(job)}\n` : jobText(job));
    return 0;
  },
};
