/**
 * `mailroom status` and `mailroom jobs get` (and `--correlation`), run as real
 * child processes against a workload prepared with the library: completed,
 * dead, waiting and scheduled jobs, and one request followed through a job, an
 * outbox event, the relay and a consumer group's job. On PostgreSQL when
 * TEST_DATABASE_URL is set, else on the embedded database. Plus
 * `jobs.byCorrelation` itself on PGlite and PostgreSQL.
 */
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { PGlite } from '@electric-sql/pglite';
import {
  defineEvent,
  defineJob,
  handle,
  handleEvent,
  PermanentError,
  ValidationError,
  type CorrelationTrail,
  type JobInfo,
  type MailroomStats,
} from '../src/index.ts';
import { UsageError, type Io } from '../src/cli/args.ts';
import { checkHealth } from '../src/cli/health.ts';
import { jobsCommand } from '../src/cli/jobs.ts';
import { statusCommand } from '../src/cli/status.ts';
import { freePort } from './helpers/brokers/free-port.ts';
import { runJson, runMailroom, showRun, type CliChild, type CliRun } from './helpers/cli.ts';
import { databaseUrl, testDatabases, type TestDatabase, type TestMailroom } from './helpers/databases.ts';
import { waitForEvents } from './helpers/events.ts';
import { flushUntil } from './helpers/relay.ts';


const work = defineJob<{ mode: 'ok' | 'poison' | 'later'; n?: number }>('clistatus.work', { queue: 'cli-work', retry: { maxAttempts: 3 } });
const orderPlaced = defineEvent<{ orderId: string }>('clistatus.order-placed', { version: 1 });

type Run = CliRun;
const mailroom = (args: string[], timeoutMs = 30_000): Promise<Run> => runMailroom(args, { timeoutMs });
const show = showRun;
const json = runJson;

/** What the workload leaves behind, for the assertions. */
interface Workload {
  correlationId: string;
  okId: string;
  deadId: string;
  eventId: string;
  consumerJobId: string;
}

/**
 * One request (correlation id) enqueues a job and publishes an event; the relay
 * fans the event out to consumer group cli-billing, whose worker handles it. A
 * poisoned job is dead-lettered; then two jobs wait and one is scheduled for later.
 */
async function runWorkload(t: TestMailroom, correlationId: string): Promise<Workload> {
  const { mailroom } = t;
  const consumer = mailroom.consumer({ group: 'cli-billing', pollInterval: 20, handlers: { [orderPlaced.type]: handleEvent(orderPlaced, async () => {}) } });
  await consumer.start();
  const worker = mailroom.worker({
    queues: ['cli-work'],
    pollInterval: 20,
    handlers: {
      [work.name]: handle(work, async (job) => {
        if (job.data.mode === 'poison') throw new PermanentError('bad address: poison');
      }),
    },
  });
  const completed = waitForEvents(worker, 'completed', 1);
  const failed = waitForEvents(worker, 'failed', 1);
  const okId = await mailroom.enqueue(work, { mode: 'ok' }, { correlationId });
  const deadId = await mailroom.enqueue(work, { mode: 'poison' });
  await worker.start();
  await Promise.all([completed, failed]);
  await worker.stop();
  const handled = waitForEvents(consumer.worker, 'completed', 1);
  const { id: eventId } = await mailroom.publish(orderPlaced, { orderId: 'o-1' }, { key: 'o-1', correlationId });
  const relay = mailroom.relay();
  await flushUntil(relay, 1, 'internal', 15_000, mailroom);
  await relay.stop();
  await handled;
  await consumer.stop();
  await mailroom.enqueueMany(work, [{ mode: 'later', n: 1 }, { mode: 'later', n: 2 }]);
  await mailroom.enqueue(work, { mode: 'later', n: 3 }, { delay: '1h' });
  const [consumerJob] = await t.sql<{ id: string }>(`SELECT id FROM "${t.schema}".jobs WHERE queue = 'consumer.cli-billing'`);
  assert.ok(consumerJob, 'the consumer group has a job for the event');
  return { correlationId, okId, deadId, eventId, consumerJobId: consumerJob.id };
}

const PER_MINUTE = Math.round((1 / 60) * 1000) / 1000;

/** The stats the workload must produce (oldestAgeSeconds is checked separately: it grows). */
function expectedStats(oldest: number): Omit<MailroomStats, 'tables'> {
  return {
    queues: {
      'cli-work': { available: 2, scheduled: 1, retrying: 0, blocked: 0, active: 0, dead: 1, oldestAgeSeconds: oldest, completedPerSecond: PER_MINUTE, failedPerSecond: PER_MINUTE },
      'consumer.cli-billing': { available: 0, scheduled: 0, retrying: 0, blocked: 0, active: 0, dead: 0, oldestAgeSeconds: 0, completedPerSecond: PER_MINUTE, failedPerSecond: 0 },
    },
    relay: { internal: { unpublished: 0, lagSeconds: 0, heldBackBy: null, holder: null, parked: 0 } },
    consumers: { 'cli-billing': { source: null, lag: 0, unrelayed: 0, unfinished: 0, dead: 0, duplicatesRejected: 0 } },
  };
}

function assertStats(actual: MailroomStats, context: string): void {
  const oldest = actual.queues['cli-work']?.oldestAgeSeconds ?? -1;
  assert.ok(oldest >= 0 && oldest < 120, `oldest waiting job age ${oldest}${context}`);
  const { tables, ...rest } = actual;
  assert.deepEqual(rest, expectedStats(oldest), context);
  // Row counts come from PostgreSQL's statistics (approximate, zero on PGlite): their shape only.
  for (const [table, t] of Object.entries(tables)) {
    assert.ok(t.liveRows >= 0 && t.deadRows >= 0 && (t.secondsSinceVacuum === null || t.secondsSinceVacuum >= 0), `table ${table}${context}`);
  }
}

// --- jobs.byCorrelation on each database -------------------------------------------------------

for (const db of testDatabases()) {
  describe(`jobs.byCorrelation on ${db.name}`, () => {
    it('lists the job, the event (with the targets that published it) and the consumer job, oldest first; nothing of other requests', async () => {
      const t = await db.open();
      const w = await runWorkload(t, `req-${db.name}`);
      await t.mailroom.enqueue(work, { mode: 'later' }, { correlationId: 'another-request' });
      const trail = await t.mailroom.jobs.byCorrelation(w.correlationId);
      assert.deepEqual(
        trail.jobs.map((j) => [j.id, j.queue, j.state, j.status, j.consumerGroup, j.eventId]),
        [
          [w.okId, 'cli-work', 'completed', 'completed', null, null],
          [w.consumerJobId, 'consumer.cli-billing', 'completed', 'completed', 'cli-billing', w.eventId],
        ],
      );
      assert.equal(trail.jobs[1]!.type, orderPlaced.type);
      assert.deepEqual(
        trail.events.map((e) => [e.id, e.type, e.key, e.publishedTo, e.pendingTo]),
        [[w.eventId, orderPlaced.type, 'o-1', ['internal'], []]],
      );
      assert.ok(trail.events[0]!.time instanceof Date && trail.jobs[0]!.createdAt instanceof Date);

      // An event no relay has reached yet: pending for the internal target.
      const { id: pending } = await t.mailroom.publish(orderPlaced, { orderId: 'o-2' }, { correlationId: w.correlationId });
      const later = await t.mailroom.jobs.byCorrelation(w.correlationId);
      assert.deepEqual(
        later.events.map((e) => [e.id, e.publishedTo, e.pendingTo]),
        [
          [w.eventId, ['internal'], []],
          [pending, [], ['internal']],
        ],
      );
      const one = await t.mailroom.jobs.byCorrelation(w.correlationId, { limit: 1 });
      assert.deepEqual([one.jobs.map((j) => j.id), one.events.map((e) => e.id)], [[w.okId], [w.eventId]]);
      assert.deepEqual(await t.mailroom.jobs.byCorrelation('nobody-sent-this'), { jobs: [], events: [] });
    });

    it('rejects an empty correlation id and a bad limit, naming the field', async () => {
      const { mailroom } = await db.open();
      await assert.rejects(mailroom.jobs.byCorrelation(''), (e: unknown) => e instanceof ValidationError && /correlationId must be a non-empty string/.test(e.message));
      await assert.rejects(mailroom.jobs.byCorrelation('r', { limit: 0 }), (e: unknown) => e instanceof ValidationError && /limit must be a whole number from 1 to 10000/.test(e.message));
      await assert.rejects(mailroom.jobs.byCorrelation(42 as unknown as string), ValidationError);
    });
  });
}

// --- the command line, on PostgreSQL when TEST_DATABASE_URL is set, else embedded ---------------

const cliDatabase: TestDatabase = testDatabases().find((d) => d.name === 'postgres') ?? testDatabases()[0]!;

describe(`mailroom status and jobs get (real binary, ${databaseUrl ? 'PostgreSQL' : 'embedded database'})`, () => {
  let w: Workload;
  const runs = new Map<string, Run>();
  const run = (name: string): Run => {
    const r = runs.get(name);
    assert.ok(r, `no run named ${name}`);
    return r;
  };
  const dirs: string[] = [];
  let refusedUrl = '';

  before(async () => {
    const t = await cliDatabase.open();
    w = await runWorkload(t, 'req-cli-1');
    // Each lane is a database the commands of one lane read: on PostgreSQL, the same schema for all; an
    // embedded directory is opened by one process at a time, so each lane gets its own copy.
    let lanes: string[][];
    if (cliDatabase.name === 'postgres') {
      const where = ['--database', databaseUrl!, '--schema', t.schema];
      lanes = [where, where, where];
    } else {
      const pglite = (await cliDatabase.handle()) as PGlite;
      const dump = await pglite.dumpDataDir('none');
      const root = mkdtempSync(join(tmpdir(), 'mailroom-cli-status-'));
      dirs.push(root);
      const first = await PGlite.create(join(root, 'lane0'), { loadDataDir: dump });
      await first.close();
      cpSync(join(root, 'lane0'), join(root, 'lane1'), { recursive: true });
      lanes = [0, 1].map((i) => ['--data-dir', join(root, `lane${i}`), '--schema', t.schema]);
    }
    refusedUrl = `postgres://someone:s3cret@127.0.0.1:${await freePort()}/mailroom`;
    const commands: [string, string[]][] = [
      ['check dead', ['status', '--check', '--max-dead', '0']],
      ['status json', ['status', '--json']],
      ['check healthy', ['status', '--check', '--max-dead', '1', '--max-age', '10m', '--json']],
      ['get ok', ['jobs', 'get', w.okId]],
      ['get dead', ['jobs', 'get', w.deadId]],
      ['get dead json', ['jobs', 'get', '--json', w.deadId]],
      ['correlation', ['jobs', 'get', '--correlation', w.correlationId]],
      ['correlation json', ['jobs', 'get', '--correlation', w.correlationId, '--json']],
      ['unknown id', ['jobs', 'get', '00000000-0000-7000-8000-000000000000']],
    ];
    // Lanes run side by side; the commands of a lane one after another.
    const queue = [...commands];
    await Promise.all(
      lanes.map(async (where) => {
        for (let next = queue.shift(); next; next = queue.shift()) runs.set(next[0], await mailroom([...next[1], ...where]));
      }),
    );
    const usage: [string, string[]][] = [
      ['malformed id', ['jobs', 'get', 'not-a-uuid']],
      ['unknown flag', ['jobs', 'get', '--corelation', 'x']],
      ['refused', ['status', '--json', '--database', refusedUrl]],
    ];
    await Promise.all(usage.map(async ([name, args]) => runs.set(name, await mailroom(args))));
  });

  after(() => {
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  it('status --json prints the stats of the workload, and exits 0 without --check even with dead letters', () => {
    const r = run('status json');
    assert.equal(r.code, 0, show(r));
    assertStats(json<MailroomStats>(r), show(r));
  });

  it('status prints a table per queue, relay target and consumer group with the same numbers; --check exits 3 with a dead letter and --max-dead 0, naming the check', () => {
    const r = run('check dead');
    assert.equal(r.code, 3, show(r));
    assert.match(r.stdout, /^\s+queue\s+available\s+scheduled\s+retrying\s+blocked\s+active\s+dead\s+oldest\s+completed\/s\s+failed\/s$/m, show(r));
    assert.match(r.stdout, new RegExp(`^\\s+cli-work\\s+2\\s+1\\s+0\\s+0\\s+0\\s+1\\s+\\d.*?\\s+${PER_MINUTE}\\s+${PER_MINUTE}$`, 'm'), show(r));
    assert.match(r.stdout, new RegExp(`^\\s+consumer\\.cli-billing\\s+0\\s+0\\s+0\\s+0\\s+0\\s+0\\s+0s\\s+${PER_MINUTE}\\s+0$`, 'm'), show(r));
    assert.match(r.stdout, /^\s+internal\s+0\s+0s\s+0\s+-\s+none running$/m, show(r));
    assert.match(r.stdout, /^\s+cli-billing\s+0\s+0\s+0\s+0\s+0\s+relay$/m, show(r));
    assert.match(r.stdout, /Unhealthy: 1 check failed/, show(r));
    assert.match(r.stdout, /^  queue cli-work: 1 dead letter, more than --max-dead 0$/m, show(r));
  });

  it('status --check exits 0 when every threshold holds, and --json carries the verdict', () => {
    const r = run('check healthy');
    assert.equal(r.code, 0, show(r));
    const out = json<MailroomStats & { health: { ok: boolean; failed: unknown[]; thresholds: Record<string, number> } }>(r);
    assert.deepEqual(out.health, { ok: true, failed: [], thresholds: { maxAgeSeconds: 600, maxDead: 1, maxLagSeconds: 60 } });
    const { health: _, ...stats } = out;
    assertStats(stats, show(r));
  });

  it('jobs get prints a completed job: state, attempts, history lines, payload', () => {
    const r = run('get ok');
    assert.equal(r.code, 0, show(r));
    assert.match(r.stdout, new RegExp(`^Job ${w.okId}$`, 'm'), show(r));
    assert.match(r.stdout, /^\s+state\s+completed$/m, show(r));
    assert.match(r.stdout, /^\s+attempts\s+1 of 3$/m, show(r));
    assert.match(r.stdout, /^\s+correlation id\s+req-cli-1$/m, show(r));
    for (const event of ['enqueued', 'started', 'completed']) assert.match(r.stdout, new RegExp(`^\\s+\\d{4}-\\d\\d-\\d\\dT\\S+Z\\s+${event}\\b`, 'm'), `${event} line${show(r)}`);
    assert.match(r.stdout, /^Errors: none$/m, show(r));
    assert.match(r.stdout, /"mode": "ok"/, show(r));
  });

  it('jobs get prints a dead job: sent to support, the error with its category, and the dead-lettered line', () => {
    const r = run('get dead');
    assert.equal(r.code, 0, show(r));
    assert.match(r.stdout, /^\s+state\s+dead \(sent to support\)$/m, show(r));
    assert.match(r.stdout, /^\s+last error\s+permanent: bad address: poison$/m, show(r));
    assert.match(r.stdout, /^\s+\S+Z\s+failed\s+1\s+permanent: bad address: poison$/m, show(r));
    assert.match(r.stdout, /^\s+\S+Z\s+dead-lettered\s+1\s+permanent$/m, show(r));
    assert.match(r.stdout, /^\s+1\s+\S+Z\s+permanent\s+\S+\s+bad address: poison$/m, 'the errors table names category, worker and message' + show(r));
    assert.match(r.stdout, /"mode": "poison"/, show(r));
  });

  it('jobs get --json prints the JobInfo', () => {
    const r = run('get dead json');
    assert.equal(r.code, 0, show(r));
    const job = json<JobInfo>(r);
    assert.equal(job.id, w.deadId);
    assert.equal(job.state, 'dead');
    assert.equal(job.status, 'sent to support');
    assert.deepEqual(job.lastError, { category: 'permanent', message: 'bad address: poison' });
    assert.deepEqual(job.data, { mode: 'poison' });
    assert.deepEqual(
      job.history.map((h) => h.event),
      ['enqueued', 'started', 'failed', 'dead-lettered'],
    );
  });

  it('jobs get --correlation lists the job, the event and the consumer job, oldest first', () => {
    const r = run('correlation');
    assert.equal(r.code, 0, show(r));
    assert.match(r.stdout, /^Correlation id req-cli-1: 2 jobs, 1 event, oldest first$/m, show(r));
    const lines = r.stdout.split('\n').filter((l) => /^\s+\d{4}-/.test(l));
    assert.equal(lines.length, 3, show(r));
    assert.match(lines[0]!, new RegExp(`\\sjob\\s+clistatus\\.work\\s+${w.okId}\\s+queue cli-work, completed, attempt 1 of 3$`), show(r));
    assert.match(lines[1]!, new RegExp(`\\sevent\\s+clistatus\\.order-placed\\s+${w.eventId}\\s+key o-1, published to internal$`), show(r));
    assert.match(
      lines[2]!,
      new RegExp(`\\sjob\\s+clistatus\\.order-placed\\s+${w.consumerJobId}\\s+consumer group cli-billing \\(queue consumer\\.cli-billing\\), completed, attempt 1 of \\d+, from event ${w.eventId}$`),
      show(r),
    );
  });

  it('jobs get --correlation --json prints the trail object', () => {
    const r = run('correlation json');
    assert.equal(r.code, 0, show(r));
    const trail = json<CorrelationTrail>(r);
    assert.deepEqual(
      trail.jobs.map((j) => [j.id, j.consumerGroup, j.eventId]),
      [
        [w.okId, null, null],
        [w.consumerJobId, 'cli-billing', w.eventId],
      ],
    );
    assert.deepEqual(trail.events.map((e) => [e.id, e.publishedTo]), [[w.eventId, ['internal']]]);
  });

  it('an unknown id exits 1 saying there is no such job', () => {
    const r = run('unknown id');
    assert.equal(r.code, 1, show(r));
    assert.match(r.stderr, /no job with id 00000000-0000-7000-8000-000000000000; check the id/, show(r));
  });

  it('bad usage exits 2 naming the problem: a malformed id, an unknown flag', () => {
    const malformed = run('malformed id');
    assert.equal(malformed.code, 2, show(malformed));
    assert.match(malformed.stderr, /"not-a-uuid" is not a job id; a job id is a UUID such as/, show(malformed));
    const flag = run('unknown flag');
    assert.equal(flag.code, 2, show(flag));
    assert.match(flag.stderr, /mailroom jobs: unknown option --corelation[\s\S]*did you mean --correlation\?/, show(flag));
  });

  it('a refused connection names the URL without its password and suggests --database / DATABASE_URL', () => {
    const r = run('refused');
    assert.equal(r.code, 1, show(r));
    const shown = refusedUrl.replace('s3cret', '***');
    const out = json<{ ok: boolean; error: { message: string } }>(r);
    assert.equal(out.ok, false, show(r));
    assert.ok(out.error.message.includes(`cannot use the database at ${shown}`), show(r));
    assert.match(out.error.message, /--database or DATABASE_URL/, show(r));
    assert.doesNotMatch(r.stderr + r.stdout, /s3cret/, show(r));
  });
});

describe('the health verdict of status --check', () => {
  const limits = { maxAgeSeconds: 300, maxDead: 0, maxLagSeconds: 60 };
  const queue = { available: 4, scheduled: 0, retrying: 0, blocked: 0, active: 1, dead: 0, oldestAgeSeconds: 0, completedPerSecond: 0, failedPerSecond: 0 };
  const target = { unpublished: 0, lagSeconds: 0, heldBackBy: null, holder: 'relay-1', parked: 0 };
  const group = { source: null, lag: 0, unrelayed: 0, unfinished: 0, dead: 0, duplicatesRejected: 0 };

  it('passes at the limits and names each crossed one: queue age, dead letters, relay lag and the consumer group waiting on it', () => {
    const atLimits: MailroomStats = {
      queues: { email: { ...queue, oldestAgeSeconds: 300 } },
      relay: { internal: { ...target, unpublished: 3, lagSeconds: 60 } },
      consumers: { billing: { ...group, unrelayed: 3, lag: 3 } },
      tables: {},
    };
    assert.deepEqual(checkHealth(atLimits, limits), []);
    const crossed: MailroomStats = {
      queues: { email: { ...queue, oldestAgeSeconds: 301, dead: 2 }, sms: queue },
      relay: {
        internal: { ...target, unpublished: 3, lagSeconds: 75, holder: null },
        rabbitmq: { ...target, unpublished: 1, lagSeconds: 90, heldBackBy: { pid: 4242, ageSeconds: 95, xid: '900', database: 'shop', applicationName: 'psql' } },
      },
      consumers: { billing: { ...group, unrelayed: 3, lag: 3 }, audit: { ...group, source: 'rabbitmq audit', lag: 9, unfinished: 9 } },
      tables: {},
    };
    assert.deepEqual(
      checkHealth(crossed, limits).map((f) => [f.check, f.subject, f.value, f.limit, f.message]),
      [
        ['max-age', 'queue email', 301, 300, 'queue email: the oldest waiting job has been due for 5m 01s, longer than --max-age 5m (4 waiting, 1 running)'],
        ['max-dead', 'queue email', 2, 0, 'queue email: 2 dead letters, more than --max-dead 0'],
        ['max-lag', 'relay target internal', 75, 60, 'relay target internal: 3 unpublished events, the oldest for 1m 15s, longer than --max-lag 1m; no relay holds this target'],
        ['max-lag', 'relay target rabbitmq', 90, 60, 'relay target rabbitmq: 1 unpublished event, the oldest for 1m 30s, longer than --max-lag 1m; held back by the open transaction of pid 4242'],
        ['max-lag', 'consumer group billing', 75, 60, 'consumer group billing: 3 events not delivered to it yet, waiting up to 1m 15s, longer than --max-lag 1m (is a relay running?)'],
      ],
    );
  });
});

describe('parked relay events in the health verdict', () => {
  it('a relay target with more parked events than --max-dead fails the max-dead check, naming the target', () => {
    const limits = { maxAgeSeconds: 300, maxDead: 0, maxLagSeconds: 60 };
    const target = { unpublished: 0, lagSeconds: 0, heldBackBy: null, holder: 'relay-1', parked: 0 };
    const stats: MailroomStats = { queues: {}, relay: { internal: target, 'nats:orders': { ...target, parked: 2 } }, consumers: {}, tables: {} };
    assert.deepEqual(
      checkHealth(stats, limits).map((f) => [f.check, f.subject, f.value, f.limit, f.message]),
      [['max-dead', 'relay target nats:orders', 2, 0, 'relay target nats:orders: 2 parked events (refused by the target for good: mailroom parked list nats:orders), more than --max-dead 0']],
    );
    assert.deepEqual(checkHealth(stats, { ...limits, maxDead: 2 }), []);
  });
});

describe('usage mistakes caught before any database is opened', () => {
  const io: Io = { out: process.stdout, err: process.stderr };
  const usage = (pattern: RegExp) => (e: unknown) => e instanceof UsageError && pattern.test(e.message);

  it('status: a duration that is not one, a count that is not one, a threshold without --check', async () => {
    await assert.rejects(statusCommand.run({ check: true, 'max-age': 'soon' }, io), usage(/--max-age: expected a duration such as 30s, 5m or 2h, got "soon"/));
    await assert.rejects(statusCommand.run({ check: true, 'max-lag': '-1s' }, io), usage(/--max-lag: expected a duration/));
    await assert.rejects(statusCommand.run({ check: true, 'max-dead': 'none' }, io), usage(/--max-dead: expected a whole number from 0/));
    await assert.rejects(statusCommand.run({ 'max-dead': '0' }, io), usage(/--max-dead only applies with --check/));
  });

  it('jobs: no subcommand, an unknown one, no id, two ids, an id with --correlation, --limit without it, an empty correlation id', () => {
    const id = '01a2325b-306e-7000-8951-29fc012ec9bc';
    assert.throws(() => jobsCommand.parse([]), usage(/expected a subcommand: get/));
    assert.throws(() => jobsCommand.parse(['list']), usage(/unknown subcommand "list"/));
    assert.throws(() => jobsCommand.parse(['get']), usage(/expected a job id \(or --correlation ID\)/));
    assert.throws(() => jobsCommand.parse(['get', id, id]), usage(/expected one job id, got 2/));
    assert.throws(() => jobsCommand.parse(['get', id, '--correlation', 'r']), usage(/give a job id or --correlation, not both/));
    assert.throws(() => jobsCommand.parse(['get', id, '--limit', '5']), usage(/--limit only applies with --correlation/));
    assert.throws(() => jobsCommand.parse(['get', '--correlation', ' ']), usage(/--correlation needs a correlation id/));
    assert.deepEqual(jobsCommand.parse(['get', '--schema', 'shop', id, '--json']), { schema: 'shop', json: true, subcommand: 'get', id });
    assert.deepEqual(jobsCommand.parse(['--correlation=req-1', 'get']), { correlation: 'req-1', subcommand: 'get' });
  });
});
