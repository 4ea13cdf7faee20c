/**
 * `mailroom dlq list|show|replay|discard`, run as the real binary (a child
 * process) against dead letters made by a real worker: on PostgreSQL when
 * TEST_DATABASE_URL is set, else on the embedded database. Each scenario has
 * its own lane (its own queues on PostgreSQL; its own copy of the embedded
 * database, which one process opens at a time), so the lanes run side by side.
 */
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { defineJob, PermanentError, type DeadLetter, type DeadLetterDetail, type Job } from '../src/index.ts';
import { newId } from '../src/ids.ts';
import { UsageError } from '../src/cli/args.ts';
import { dlqCommand, parseRate } from '../src/cli/dlq.ts';
import { startProgress } from '../src/cli/progress.ts';
import { runJson, runMailroom, showRun, type CliChild, type CliRun } from './helpers/cli.ts';
import { databaseUrl, testDatabases, type TestDatabase } from './helpers/databases.ts';
import { waitForEvents } from './helpers/events.ts';

const BULK = 30;

interface Item {
  message: string;
  password?: string;
}
const defs = {
  a: defineJob<Item>('clidlq.signup', { queue: 'clidlq-a', retry: { maxAttempts: 1 } }),
  b: defineJob<Item>('clidlq.invoice', { queue: 'clidlq-b', retry: { maxAttempts: 1 } }),
  c: defineJob<Item>('clidlq.cleanup', { queue: 'clidlq-c', retry: { maxAttempts: 1 } }),
  bulk: defineJob<Item>('clidlq.bulk', { queue: 'clidlq-bulk', retry: { maxAttempts: 1 } }),
};

type Run = CliRun;
const mailroom = (args: string[], onStderr?: (text: string, child: CliChild) => void, timeoutMs = 60_000): Promise<Run> => runMailroom(args, { onStderr, timeoutMs });
const show = showRun;
const json = runJson;

/** A database the commands of one scenario use, and SQL on it from the test (when no command runs). */
type Sql = <R = Record<string, unknown>>(text: string, params?: unknown[]) => Promise<R[]>;

interface Lane {
  args: string[];
  /** Runs `fn` with SQL on the lane's database (for an embedded one: opened once for `fn`, while no command runs). */
  read<T>(fn: (sql: Sql) => Promise<T>): Promise<T>;
  /** Runs commands that do not depend on each other: side by side on a server, one at a time on an embedded directory. */
  all(commands: string[][]): Promise<Run[]>;
}

const cliDatabase: TestDatabase = testDatabases().find((d) => d.name === 'postgres') ?? testDatabases()[0]!;

describe(`mailroom dlq (real binary, ${databaseUrl ? 'PostgreSQL' : 'embedded database'})`, { concurrency: true }, () => {
  const ids: Record<keyof typeof defs, string[]> = { a: [], b: [], c: [], bulk: [] };
  let completedId = '';
  let schema = '';
  const lanes: Lane[] = [];
  const dirs: string[] = [];
  let pool: pg.Pool | undefined;

  before(async () => {
    const t = await cliDatabase.open();
    schema = t.schema;
    const { mailroom: m } = t;
    ids.a = await m.enqueueMany(defs.a, [{ message: 'SMTP said 550 mailbox unavailable', password: 'hunter2' }, { message: 'address rejected' }, { message: '50% off is not a price' }]);
    ids.b = await m.enqueueMany(defs.b, [{ message: 'invoice template missing' }, { message: 'invoice total negative' }]);
    ids.c = await m.enqueueMany(defs.c, [{ message: 'cleanup of a deleted account' }, { message: 'cleanup twice' }]);
    ids.bulk = await m.enqueueMany(defs.bulk, Array.from({ length: BULK }, (_, n) => ({ message: `bulk failure ${n}` })));
    const fail = (job: Job<Item>) => {
      throw new PermanentError(job.data.message);
    };
    const worker = m.worker({ queues: Object.values(defs).map((d) => d.queue), pollInterval: 10, concurrency: 20, handlers: Object.fromEntries(Object.values(defs).map((d) => [d.name, fail])) });
    const failed = waitForEvents(worker, 'failed', Object.values(ids).flat().length);
    await worker.start();
    await failed;
    await worker.stop();
    await t.sql(`UPDATE "${schema}".jobs SET state = 'completed', finished_at = now(), dead_reason = NULL WHERE id = $1`, [ids.c[1]]);
    completedId = ids.c[1]!;

    if (cliDatabase.name === 'postgres') {
      pool = new pg.Pool({ connectionString: databaseUrl, max: 3 });
      const args = ['--database', databaseUrl!, '--schema', schema];
      const lane: Lane = {
        args,
        read: (fn) => fn(async (text, params) => (await pool!.query(text, params)).rows),
        all: (commands) => Promise.all(commands.map((c) => mailroom([...c, ...args]))),
      };
      lanes.push(lane, lane, lane, lane);
    } else {
      // The commands open the embedded database from a directory: copy the seeded one into one per lane.
      const dump = await ((await cliDatabase.handle()) as PGlite).dumpDataDir('none');
      const root = mkdtempSync(join(tmpdir(), 'mailroom-cli-dlq-'));
      dirs.push(root);
      const first = await PGlite.create(join(root, 'lane0'), { loadDataDir: dump });
      await first.close();
      for (const i of [0, 1, 2, 3]) {
        const dir = join(root, `lane${i}`);
        if (i > 0) cpSync(join(root, 'lane0'), dir, { recursive: true });
        const args = ['--data-dir', dir, '--schema', schema];
        lanes.push({
          args,
          all: async (commands) => {
            const runs: Run[] = [];
            for (const c of commands) runs.push(await mailroom([...c, ...args]));
            return runs;
          },
          read: async (fn) => {
            const db = await PGlite.create(dir);
            try {
              return await fn(async (text, params) => (await db.query(text, params)).rows as never);
            } finally {
              await db.close();
            }
          },
        });
      }
    }
  });

  after(async () => {
    await pool?.end();
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  it('list: a table, --json, paged with --limit and --cursor without gaps or repeats, --text with a literal %', async () => {
    const lane = lanes[0]!;
    const [table, page1, text] = await lane.all([
      ['dlq', 'list', '--queue', 'clidlq-a'],
      ['dlq', 'list', '--queue', 'clidlq-a', '--limit', '2', '--json'],
      ['dlq', 'list', '--text', '50%', '--json'],
    ]);
    assert.equal(table!.code, 0, show(table!));
    assert.match(table!.stdout, /^3 dead letters in schema ".*" on .*, newest first:$/m, show(table!));
    assert.match(table!.stdout, /^\s+died\s+id\s+queue\s+type\s+category\s+attempts\s+message$/m, show(table!));
    for (const id of ids.a) assert.match(table!.stdout, new RegExp(`^\\s+\\S+Z\\s+${id}\\s+clidlq-a\\s+clidlq\\.signup\\s+permanent\\s+1/1\\s+\\S`, 'm'), show(table!));
    assert.doesNotMatch(table!.stdout, /clidlq-b|More:/, show(table!));

    assert.equal(page1!.code, 0, show(page1!));
    const first = json<{ items: Record<string, unknown>[]; next: string | null }>(page1!);
    assert.equal(first.items.length, 2);
    assert.equal(typeof first.next, 'string');
    const [page2] = await lane.all([['dlq', 'list', '--queue', 'clidlq-a', '--limit', '2', '--json', '--cursor', first.next!]]);
    const second = json<{ items: Record<string, unknown>[]; next: string | null }>(page2!);
    assert.equal(second.next, null, show(page2!));
    const all = [...first.items, ...second.items];
    assert.deepEqual(all.map((d) => d.id).sort(), [...ids.a].sort(), 'every dead letter once, across the pages');
    const entry = all.find((d) => d.id === ids.a[0])!;
    assert.deepEqual({ ...entry, firstSeenAt: typeof entry.firstSeenAt, diedAt: typeof entry.diedAt }, {
      id: ids.a[0],
      queue: 'clidlq-a',
      owner: null,
      type: 'clidlq.signup',
      category: 'permanent',
      reason: 'permanent',
      message: 'SMTP said 550 mailbox unavailable',
      attempts: 1,
      maxAttempts: 1,
      correlationId: null,
      firstSeenAt: 'string',
      diedAt: 'string',
      data: { message: 'SMTP said 550 mailbox unavailable', password: 'hunter2' },
    });
    assert.ok(new Date(entry.diedAt as string).getTime() >= new Date(entry.firstSeenAt as string).getTime());

    assert.deepEqual(json<{ items: DeadLetter[] }>(text!).items.map((d) => d.id), [ids.a[2]], show(text!));
  });

  it('show: a readable block and --json with the history; an unknown id or a job that is not dead exits 1 saying which', async () => {
    const lane = lanes[3]!;
    const missing = newId();
    const [readable, asJson, none, live] = await lane.all([
      ['dlq', 'show', ids.a[1]!],
      ['dlq', 'show', '--json', ids.a[1]!],
      ['dlq', 'show', missing],
      ['dlq', 'show', completedId],
    ]);
    assert.equal(readable!.code, 0, show(readable!));
    assert.match(readable!.stdout, new RegExp(`^Dead letter ${ids.a[1]}$`, 'm'), show(readable!));
    assert.match(readable!.stdout, /^\s+message\s+address rejected$/m, show(readable!));
    for (const event of ['enqueued', 'started', 'failed', 'dead-lettered']) assert.match(readable!.stdout, new RegExp(`^\\s+\\S+Z\\s+${event}\\b`, 'm'), show(readable!));
    assert.match(readable!.stdout, /"message": "address rejected"/, show(readable!));

    assert.equal(asJson!.code, 0, show(asJson!));
    const detail = json<DeadLetterDetail>(asJson!);
    assert.equal(detail.id, ids.a[1]);
    assert.equal(detail.category, 'permanent');
    assert.deepEqual(detail.history.map((h) => h.event), ['enqueued', 'started', 'failed', 'dead-lettered']);
    assert.deepEqual(detail.errors.map((e) => [e.attempt, e.category, e.message]), [[1, 'permanent', 'address rejected']]);

    assert.equal(none!.code, 1, show(none!));
    assert.match(none!.stderr, new RegExp(`no dead letter with id ${missing}: there is no such job`), show(none!));
    assert.equal(live!.code, 1, show(live!));
    assert.match(live!.stderr, /is not a dead letter \(its state is completed\); `mailroom jobs get .*` shows its history/, show(live!));
  });

  it('replay --dry-run changes nothing; replay puts them back in place and records who; discard cancels; unknown ids are reported and exit 1', async () => {
    const lane = lanes[1]!;
    const dry = await mailroom(['dlq', 'replay', '--queue', 'clidlq-b', '--dry-run', '--json', ...lane.args]);
    assert.equal(dry.code, 0, show(dry));
    const dryResult = json<Record<string, unknown>>(dry);
    assert.deepEqual({ ...dryResult, replayId: typeof dryResult.replayId, by: typeof dryResult.by }, {
      action: 'replay',
      by: 'string',
      matched: 2,
      replayed: 0,
      replayId: 'string',
      skipped: 0,
      dryRun: true,
      interrupted: false,
    });

    const replay = await mailroom(['dlq', 'replay', '--queue', 'clidlq-b', '--by', 'dana@ops', ...lane.args]);
    assert.equal(replay.code, 0, show(replay));
    assert.match(replay.stdout, /^\s+matched\s+2$/m, show(replay));
    assert.match(replay.stdout, /^\s+replayed\s+2$/m, show(replay));
    assert.match(replay.stdout, /^\s+by\s+dana@ops$/m, show(replay));
    const replayId = /^\s+replay id\s+(\S+)$/m.exec(replay.stdout)?.[1];
    assert.ok(replayId, show(replay));

    const discard = await mailroom(['dlq', 'discard', '--id', ids.c[0]!, '--json', ...lane.args]);
    assert.equal(discard.code, 0, show(discard));
    assert.deepEqual(
      (({ action, matched, discarded, dryRun, interrupted }) => ({ action, matched, discarded, dryRun, interrupted }))(json<Record<string, unknown>>(discard)),
      { action: 'discard', matched: 1, discarded: 1, dryRun: false, interrupted: false },
    );

    const missing = newId();
    const notFound = await mailroom(['dlq', 'replay', '--id', `${ids.b[0]},${missing}`, '--id', ids.a[0]!, ...lane.args]);
    assert.equal(notFound.code, 1, show(notFound));
    assert.match(notFound.stdout, new RegExp(`not found: ${missing}`), show(notFound));
    assert.match(notFound.stdout, new RegExp(`not found: ${ids.b[0]}`), `already replayed: not a dead letter any more${show(notFound)}`);
    assert.match(notFound.stdout, /^\s+replayed\s+1$/m, `the one dead letter among the ids${show(notFound)}`);
    assert.match(notFound.stderr, /2 of the ids given are not dead letters/, show(notFound));

    const db = await lane.read(async (sql) => ({
      states: await sql(`SELECT queue, state, count(*)::int AS n FROM "${schema}".jobs WHERE queue IN ('clidlq-b', 'clidlq-c') GROUP BY queue, state ORDER BY queue, state`),
      record: await sql(`SELECT action, matched, replayed, dry_run, by, interrupted FROM "${schema}".dead_letter_replays WHERE id = $1`, [replayId]),
      budgets: await sql(`SELECT attempt, max_attempts FROM "${schema}".jobs WHERE queue = 'clidlq-b'`),
    }));
    assert.deepEqual(db.states, [
      { queue: 'clidlq-b', state: 'available', n: 2 },
      { queue: 'clidlq-c', state: 'cancelled', n: 1 },
      { queue: 'clidlq-c', state: 'completed', n: 1 },
    ]);
    assert.deepEqual(db.record, [{ action: 'replay', matched: 2, replayed: 2, dry_run: false, by: 'dana@ops', interrupted: false }]);
    assert.deepEqual(db.budgets, [{ attempt: 1, max_attempts: 2 }, { attempt: 1, max_attempts: 2 }], 'fresh attempts');
  });

  it('SIGINT during a rate-limited replay stops after the batch in flight, prints what was done and exits 130; run again, the rest is replayed, each job once', async () => {
    const lane = lanes[2]!;
    let signalled = false;
    const interrupted = await mailroom(['dlq', 'replay', '--queue', 'clidlq-bulk', '--rate', '10/s', '--json', ...lane.args], (stderr, child) => {
      if (!signalled && /^replay: \d+\/30 /m.test(stderr)) {
        signalled = true;
        child.kill('SIGINT');
      }
    });
    assert.ok(signalled, `no progress line seen${show(interrupted)}`);
    assert.equal(interrupted.code, 130, show(interrupted));
    const printed = json<{ matched: number; replayed: number; interrupted: boolean; replayId: string }>(interrupted);
    assert.equal(printed.interrupted, true, show(interrupted));
    assert.equal(printed.matched, BULK);
    assert.ok(printed.replayed >= 1 && printed.replayed < BULK, `replayed ${printed.replayed} of ${BULK} before stopping${show(interrupted)}`);
    const counts = (sql: Sql) =>
      sql<{ state: string; n: number }>(`SELECT state, count(*)::int AS n FROM "${schema}".jobs WHERE queue = 'clidlq-bulk' GROUP BY state`).then((rows) =>
        Object.fromEntries(rows.map((r) => [r.state, r.n])),
      );
    const afterStop = await lane.read(async (sql) => ({
      counts: await counts(sql),
      record: await sql(`SELECT replayed, interrupted, finished_at IS NOT NULL AS finished FROM "${schema}".dead_letter_replays WHERE id = $1`, [printed.replayId]),
    }));
    assert.deepEqual(afterStop.counts, { available: printed.replayed, dead: BULK - printed.replayed }, 'the database says what the command printed');
    assert.deepEqual(afterStop.record, [{ replayed: printed.replayed, interrupted: true, finished: true }]);

    const rest = await mailroom(['dlq', 'replay', '--queue', 'clidlq-bulk', '--json', ...lane.args]);
    assert.equal(rest.code, 0, show(rest));
    assert.deepEqual((({ matched, replayed, interrupted }) => ({ matched, replayed, interrupted }))(json<Record<string, unknown>>(rest)), {
      matched: BULK - printed.replayed,
      replayed: BULK - printed.replayed,
      interrupted: false,
    });
    const { final, links } = await lane.read(async (sql) => ({
      final: await counts(sql),
      links: await sql<{ job_id: string; n: number }>(
        `SELECT r.job_id, count(*)::int AS n FROM "${schema}".dead_letter_replay_jobs AS r JOIN "${schema}".jobs AS j ON j.id = r.job_id WHERE j.queue = 'clidlq-bulk' GROUP BY r.job_id`,
      ),
    }));
    assert.deepEqual(final, { available: BULK });
    assert.deepEqual(links.map((l) => l.job_id).sort(), [...ids.bulk].sort(), 'every job replayed');
    assert.ok(links.every((l) => l.n === 1), 'each exactly once');
  });

  it('a config file (--config, or mailroom.config.* in the current directory) redacts payloads and names queue owners in dlq and jobs output', async () => {
    const lane = lanes[1]!;
    const dir = mkdtempSync(join(tmpdir(), 'mailroom-cli-config-'));
    dirs.push(dir);
    const file = join(dir, 'mailroom.config.json');
    writeFileSync(file, JSON.stringify({ redact: ['password'], queues: { 'clidlq-a': { owner: 'growth' } } }, null, 2));
    const id = ids.a[0]!;
    const [shown, job, listed, plain] = await lane.all([
      ['dlq', 'show', id, '--config', file, '--json'],
      ['jobs', 'get', id, '--config', file, '--json'],
      ['dlq', 'list', '--queue', 'clidlq-a', '--config', file, '--json'],
      ['dlq', 'show', id, '--json'],
    ]);
    assert.equal((json<DeadLetterDetail>(shown!).data as Item).password, '[redacted]', show(shown!));
    assert.equal((json<{ data: Item }>(job!).data).password, '[redacted]', show(job!));
    assert.deepEqual(json<{ items: DeadLetter[] }>(listed!).items.map((d) => d.owner), ['growth', 'growth', 'growth'], show(listed!));
    assert.equal((json<DeadLetterDetail>(plain!).data as Item).password, 'hunter2', 'without a config nothing is redacted');
    // Found in the current directory without --config.
    const here = await runMailroom(['dlq', 'show', id, '--json', ...lane.args], { cwd: dir });
    assert.equal((json<DeadLetterDetail>(here).data as Item).password, '[redacted]', show(here));
    // A broken config is a usage error naming the file and line.
    writeFileSync(file, '{\n  "redact": ["password"],\n}\n');
    const [broken] = await lane.all([['dlq', 'show', id, '--config', file]]);
    assert.equal(broken!.code, 2, show(broken!));
    assert.match(broken!.stderr, /mailroom\.config\.json:3:1/, show(broken!));
  });

  it('bad input exits 2 and says what to write: a rate, a time, no filter, a malformed id, an unknown option', async () => {
    const where = lanes[0]!.args;
    const cases: [string[], RegExp][] = [
      [['dlq', 'replay', '--all', '--rate', 'ten'], /--rate "ten" is not a rate; expected N\/s, N\/m or N\/h/],
      [['dlq', 'list', '--since', 'yesterday'], /--since "yesterday" is not a time\nhint: give an ISO 8601 date .* or a duration meaning that long ago \(30m, 2h, 3d, 1w\)/],
      [['dlq', 'discard', '--json'], /^$/],
      [['dlq', 'replay'], /no filter given; refusing to replay every dead letter by accident\nhint: .*pass --all/],
      [['dlq', 'show', 'not-a-uuid'], /"not-a-uuid" is not a job id; a job id is a UUID/],
      [['dlq', 'list', '--queu', 'x'], /unknown option --queu\nhint: did you mean --queue\?/],
    ];
    const runs = await Promise.all(cases.map(([args]) => mailroom([...args, ...where])));
    for (const [i, run] of runs.entries()) {
      assert.equal(run.code, 2, show(run));
      assert.match(run.stderr, cases[i]![1], show(run));
    }
    const usage = json<{ ok: boolean; error: { kind: string; message: string; hint: string } }>(runs[2]!);
    assert.deepEqual([usage.ok, usage.error.kind], [false, 'usage']);
    assert.match(usage.error.message, /refusing to discard every dead letter/);
    assert.match(usage.error.hint, /--all/);
  });

  it('the argument parser (in process): every other usage mistake names the problem', () => {
    const cases: [string[], RegExp][] = [
      [['replay', '--queue', 'x', '--until', '2024-01-01', '--since', '2024-02-01'], /since \(2024-02-01T00:00:00.000Z\) is after until/],
      [['replay', '--id', 'abc'], /--id "abc" is not a job id/],
      [['list', '--rate', '10/s'], /--rate does not apply here \(it is for replay\)/],
      [['discard', '--limit', '3', '--all'], /--limit does not apply here \(it is for list and replay\)/],
      [['show', '--queue', 'x', newId()], /--queue does not apply here/],
      [['show'], /expected one job id/],
      [['replay', 'extra', '--all'], /unexpected argument "extra"/],
      [['purge'], /unknown subcommand "purge"/],
      [[], /expected a subcommand: list, show, replay or discard/],
    ];
    for (const [args, message] of cases) assert.throws(() => dlqCommand.parse(args), (e: unknown) => e instanceof UsageError && message.test(e.message), args.join(' '));
    const id1 = newId();
    const id2 = newId();
    assert.equal(dlqCommand.parse(['replay', '--id', id1, '--id', `${id2}, ${id1}`]).ids, `${id1},${id2},${id1}`, 'repeated and comma-separated ids');
    assert.equal(parseRate('600/h'), 1 / 6);
    assert.equal(parseRate('10/s'), 10);
    assert.equal(parseRate('30/m'), 0.5);
    assert.throws(() => parseRate('0/s'), /expected N\/s, N\/m or N\/h/);
  });

  it('progress (in process): a bar redrawn in place on a terminal; elsewhere a line at once, then about one a second', () => {
    let now = 0;
    const tty = { text: '', isTTY: true, write(t: string) { this.text += t; } };
    const bar = startProgress(tty, 'replay', 40, () => now);
    bar.update(10);
    now += 50;
    bar.update(20); // within 100 ms of the last redraw: not drawn
    now += 100;
    bar.update(30);
    bar.finish();
    assert.equal(tty.text, '\rreplay [########......................] 10/40 25%\rreplay [#######################.......] 30/40 75%\n');
    const log = { text: '', write(t: string) { this.text += t; } };
    now = 0;
    const lines = startProgress(log, 'discard', 3, () => now);
    lines.update(1);
    now += 500;
    lines.update(2);
    lines.finish();
    assert.equal(log.text, 'discard: 1/3 (33%)\ndiscard: 2/3 (66%)\n');
  });
});
