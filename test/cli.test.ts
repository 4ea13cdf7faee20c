/**
 * The `mailroom` command line, run as a real child process: help, usage
 * errors, migrate on the embedded database, and the demo (embedded always;
 * on PostgreSQL with SIGKILLed worker processes when TEST_DATABASE_URL is set),
 * checked against the ledger it prints as JSON.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import type { Ledger as DemoLedger } from '../src/demo/ledger.ts';
import { runMailroom, type CliRun } from './helpers/cli.ts';

const databaseUrl = process.env.TEST_DATABASE_URL;

type Run = CliRun;
/** Runs `mailroom ...args` from source in a child process (test/helpers/cli.ts). */
const mailroom = (args: string[], options: { cwd?: string; timeoutMs?: number } = {}): Promise<Run> => runMailroom(args, options);

function parseJson<T>(run: Run, what: string): T {
  try {
    return JSON.parse(run.stdout) as T;
  } catch {
    throw new Error(`${what}: stdout is not JSON (exit ${run.code})\nstdout:\n${run.stdout}\nstderr:\n${run.stderr}`);
  }
}

/** The demo's ledger as `demo --json` prints it (src/demo/ledger.ts). */
type Ledger = DemoLedger;

/** What every demo run of 300 jobs must show, whatever the database and the kind of crash. */
function assertDemoLedger(run: Run, crashKind: 'abandon' | 'sigkill'): Ledger {
  const ledger = parseJson<Ledger>(run, 'demo --json');
  const context = `\nledger: ${run.stdout}\nstderr: ${run.stderr}`;
  assert.equal(run.code, 0, `demo exited with ${run.code}${context}`);
  assert.equal(ledger.ok, true, `ledger not ok${context}`);
  assert.equal(ledger.enqueued, 300, context);
  assert.equal(ledger.lost, 0, context);
  assert.equal(ledger.runAfterCompletion, 0, context);
  assert.equal(ledger.unexpected, 0, context);
  // 300 = 1 unknown type + 3 permanent + 3 exhausting maxAttempts + 30 flaky + 263 that just work.
  assert.deepEqual(ledger.deadLettered.byCategory, { permanent: 3, 'max-attempts': 3, 'unknown-type': 1 }, context);
  assert.deepEqual(ledger.expected.deadLettered, { permanent: 3, 'max-attempts': 3, 'unknown-type': 1 }, context);
  assert.equal(ledger.deadLettered.total, 7, context);
  assert.equal(ledger.completed, 293, context);
  // Effects go through ctx.tx: exactly one per completed job, however often it ran.
  assert.deepEqual(ledger.effects, { applied: 293, duplicated: 0, missing: 0 }, context);
  // 30 flaky jobs fail twice each and 3 jobs exhaust 3 attempts: at least 66 retries, all recorded as runs.
  assert.ok(ledger.retried.retries >= 66, `expected at least 66 retries${context}`);
  assert.ok(ledger.runs.total >= 299 + 66, `expected every run recorded${context}`);
  assert.equal(ledger.crashes.kind, crashKind, context);
  assert.ok(ledger.crashes.count >= 1, `expected at least one crash${context}`);
  const inFlight = ledger.crashes.workers.reduce((sum, c) => sum + c.inFlight, 0);
  assert.ok(inFlight >= 1, `expected the crashed workers to hold jobs${context}`);
  assert.ok(ledger.rescued >= 1, `expected jobs rescued after lease expiry${context}`);
  return ledger;
}

describe('mailroom command line', () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'mailroom-cli-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('help lists the commands and exits 0', async () => {
    const [help, flag, command] = await Promise.all([mailroom(['help']), mailroom(['--help']), mailroom(['help', 'demo'])]);
    assert.equal(help.code, 0, help.stderr);
    assert.match(help.stdout, /migrate/);
    assert.match(help.stdout, /demo/);
    assert.equal(flag.code, 0, flag.stderr);
    assert.equal(flag.stdout, help.stdout);
    assert.equal(command.code, 0, command.stderr);
    assert.match(command.stdout, /--jobs N/);
  });

  test('usage mistakes exit 2 and name the culprit', async () => {
    const [command, typo, option, value, json] = await Promise.all([
      mailroom(['frobnicate']),
      mailroom(['migrat']),
      mailroom(['migrate', '--frob']),
      mailroom(['demo', '--jobs', 'many']),
      mailroom(['frobnicate', '--json']),
    ]);
    assert.equal(command.code, 2);
    assert.match(command.stderr, /unknown command "frobnicate"/);
    assert.match(command.stderr, /mailroom help/);
    assert.equal(typo.code, 2);
    assert.match(typo.stderr, /did you mean `mailroom migrate`/);
    assert.equal(option.code, 2);
    assert.match(option.stderr, /unknown option --frob/);
    assert.equal(value.code, 2);
    assert.match(value.stderr, /--jobs: expected a whole number/);
    assert.equal(json.code, 2);
    assert.equal(parseJson<{ ok: boolean; error: { kind: string } }>(json, '--json error').error.kind, 'usage');
  });

  test('migrate creates the tables in the embedded database (./.mailroom), then has nothing to do', async () => {
    const first = await mailroom(['migrate', '--schema', 'cli_test', '--json'], { cwd: dir, timeoutMs: 60_000 });
    assert.equal(first.code, 0, first.stderr);
    const applied = parseJson<{ applied: string[]; schema: string; database: string }>(first, 'migrate --json');
    assert.equal(applied.database, 'embedded');
    assert.equal(applied.schema, 'cli_test');
    assert.ok(applied.applied.includes('0001_jobs'), first.stdout);
    assert.ok(existsSync(join(dir, '.mailroom')), 'the embedded database lives in ./.mailroom');
    assert.equal(first.stderr, '', '--json prints no progress');
    const again = await mailroom(['migrate', '--schema', 'cli_test'], { cwd: dir, timeoutMs: 60_000 });
    assert.equal(again.code, 0, again.stderr);
    assert.match(again.stdout, /up to date/);
    assert.equal(again.stderr, '', 'nothing to apply: no progress');
    // For people: progress on stderr (lines, as stderr is not a terminal here), the result on stdout.
    const other = await mailroom(['migrate', '--schema', 'cli_test_progress'], { cwd: dir, timeoutMs: 60_000 });
    assert.equal(other.code, 0, other.stderr);
    const total = applied.applied.length;
    // A line at once, then about one a second (a slow machine may show some in between), then the last.
    const lines = other.stderr.trim().split('\n');
    assert.equal(lines[0], `migrate: 0/${total} (0%)`);
    assert.equal(lines.at(-1), `migrate: ${total}/${total} (100%)`);
    const counts = lines.map((line) => {
      const match = /^migrate: (\d+)\/(\d+) \(\d+%\)$/.exec(line);
      assert.ok(match && Number(match[2]) === total, `a progress line, not ${JSON.stringify(line)}`);
      return Number(match[1]);
    });
    assert.ok(counts.every((count, i) => i === 0 || count > counts[i - 1]!), `progress only goes up: ${lines.join(' | ')}`);
    assert.match(other.stdout, new RegExp(`^Applied ${total} migrations to schema "cli_test_progress"`));
  });

  test('demo on the embedded database: in-process crashes, nothing lost, nothing run after completion', async () => {
    const run = await mailroom(['demo', '--jobs', '300', '--json'], { cwd: dir, timeoutMs: 90_000 });
    assertDemoLedger(run, 'abandon');
  });

  test('migrate and demo on PostgreSQL: SIGKILLed worker processes, nothing lost', { skip: databaseUrl ? false : 'TEST_DATABASE_URL is not set' }, async () => {
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 1 });
    const schema = `cli_migrate_${process.pid}`;
    try {
      const migrated = await mailroom(['migrate', '--database', databaseUrl!, '--schema', schema, '--json']);
      assert.equal(migrated.code, 0, migrated.stderr);
      assert.ok(parseJson<{ applied: string[] }>(migrated, 'migrate --json').applied.includes('0001_jobs'));
      const run = await mailroom(['demo', '--database', databaseUrl!, '--jobs', '300', '--json', '--drop'], { timeoutMs: 90_000 });
      const ledger = assertDemoLedger(run, 'sigkill');
      const { rows } = await pool.query('SELECT 1 FROM information_schema.schemata WHERE schema_name = $1', [ledger.schema]);
      assert.equal(rows.length, 0, '--drop removes the demo schema');
    } finally {
      await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => {});
      await pool.end();
    }
  });

  describe('doctor: the adapters\' safety checks against the real brokers', () => {
    const redisUrl = process.env.REDIS_URL;
    const natsUrl = process.env.NATS_URL;
    const rabbitUrl = process.env.RABBITMQ_URL;
    interface DoctorReport {
      ok: boolean;
      checked: string[];
      warnings: { code: string; subject: string; message: string }[];
      failures: { subject: string; message: string }[];
    }

    test('usage: no broker, or a broker without what to check, exits 2 and says what is missing', async () => {
      const none = await mailroom(['doctor']);
      assert.equal(none.code, 2);
      assert.match(none.stderr, /name at least one broker to check/);
      const noStream = await mailroom(['doctor', '--nats', 'nats://127.0.0.1:4222']);
      assert.equal(noStream.code, 2);
      assert.match(noStream.stderr, /--stream is required with --nats/);
    });

    test('Redis that keeps nothing on disk: exit 1 with redis-no-persistence', { skip: redisUrl ? false : 'REDIS_URL is not set' }, async () => {
      // The machine's Redis runs with --save "" --appendonly no (what .ci/run starts).
      const run = await mailroom(['doctor', '--redis', redisUrl!, '--redis-stream', 'doctor-test', '--json']);
      assert.equal(run.code, 1, run.stderr);
      const report = parseJson<DoctorReport>(run, 'doctor --json');
      assert.deepEqual(report.warnings.map((w) => w.code), ['redis-no-persistence']);
      assert.match(report.warnings[0]!.message, /appendonly/);
    });

    test('NATS: a missing stream and a short duplicate window are reported; a sound stream passes with exit 0', { skip: natsUrl ? false : 'NATS_URL is not set' }, async () => {
      const { connect } = await import('@nats-io/transport-node');
      const { jetstreamManager } = await import('@nats-io/jetstream');
      const nc = await connect({ servers: natsUrl! });
      const jsm = await jetstreamManager(nc);
      const short = `doctor-short-${process.pid}`;
      const sound = `doctor-sound-${process.pid}`;
      try {
        await jsm.streams.add({ name: short, subjects: [`${short}.>`], duplicate_window: 1_000_000_000 });
        await jsm.streams.add({ name: sound, subjects: [`${sound}.>`], duplicate_window: 120_000_000_000 });
        const missing = await mailroom(['doctor', '--nats', natsUrl!, '--stream', `doctor-missing-${process.pid}`, '--json']);
        assert.equal(missing.code, 1);
        assert.deepEqual(parseJson<DoctorReport>(missing, 'doctor --json').warnings.map((w) => w.code), ['nats-stream-missing']);
        const window = await mailroom(['doctor', '--nats', natsUrl!, '--stream', short, '--json']);
        assert.equal(window.code, 1);
        assert.deepEqual(parseJson<DoctorReport>(window, 'doctor --json').warnings.map((w) => w.code), ['nats-duplicate-window']);
        const ok = await mailroom(['doctor', '--nats', natsUrl!, '--stream', sound]);
        assert.equal(ok.code, 0, ok.stdout + ok.stderr);
        assert.match(ok.stdout, /No problems found \(nats stream doctor-sound-/);
      } finally {
        await jsm.streams.delete(short).catch(() => false);
        await jsm.streams.delete(sound).catch(() => false);
        await nc.close();
      }
    });

    test('RabbitMQ: an existing exchange passes; a missing one is rabbitmq-exchange-missing (nothing is declared)', { skip: rabbitUrl ? false : 'RABBITMQ_URL is not set' }, async () => {
      const ok = await mailroom(['doctor', '--rabbitmq', rabbitUrl!, '--exchange', 'amq.topic', '--json']);
      assert.equal(ok.code, 0, ok.stdout + ok.stderr);
      assert.deepEqual(parseJson<DoctorReport>(ok, 'doctor --json').warnings, []);
      const name = `doctor-missing-${process.pid}`;
      const missing = await mailroom(['doctor', '--rabbitmq', rabbitUrl!, '--exchange', name, '--json']);
      assert.equal(missing.code, 1);
      assert.deepEqual(parseJson<DoctorReport>(missing, 'doctor --json').warnings.map((w) => w.code), ['rabbitmq-exchange-missing']);
      const again = await mailroom(['doctor', '--rabbitmq', rabbitUrl!, '--exchange', name, '--json']);
      assert.deepEqual(parseJson<DoctorReport>(again, 'doctor --json').warnings.map((w) => w.code), ['rabbitmq-exchange-missing'], 'doctor declared nothing');
    });
  });
});

describe('mailroom bench: mailroom alone on the given database, in a scratch schema dropped after', () => {
  interface BenchReport {
    database: string;
    drain: { jobs: number; jobsPerSecond: number };
    enqueue: { jobsPerSecond: number };
    latency: { jobs: number; p50Ms: number; p99Ms: number; maxMs: number };
  }
  const check = (run: Run): BenchReport => {
    assert.equal(run.code, 0, run.stdout + run.stderr);
    const report = parseJson<BenchReport>(run, 'bench --json');
    assert.equal(report.drain.jobs, 300);
    assert.ok(report.drain.jobsPerSecond > 0 && report.enqueue.jobsPerSecond > 0, run.stdout);
    assert.equal(report.latency.jobs, 20);
    assert.ok(report.latency.p50Ms > 0 && report.latency.p50Ms <= report.latency.p99Ms && report.latency.p99Ms <= report.latency.maxMs, run.stdout);
    return report;
  };

  test('embedded: a temporary database, removed afterwards', async () => {
    const run = await mailroom(['bench', '--jobs', '300', '--latency-jobs', '20', '--rate', '100', '--json'], { timeoutMs: 60_000 });
    const report = check(run);
    const dir = /embedded PGlite in (.+)$/.exec(report.database)?.[1];
    assert.ok(dir, report.database);
    assert.equal(existsSync(dir), false, 'the temporary database is gone');
  });

  test('PostgreSQL: the scratch schema is dropped', { skip: databaseUrl ? false : 'TEST_DATABASE_URL is not set' }, async () => {
    const run = await mailroom(['bench', '--database', databaseUrl!, '--jobs', '300', '--latency-jobs', '20', '--rate', '100', '--json'], { timeoutMs: 60_000 });
    check(run);
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 1 });
    try {
      const { rows } = await pool.query(`SELECT nspname FROM pg_namespace WHERE nspname LIKE 'mailroom_bench_%'`);
      assert.deepEqual(rows, []);
    } finally {
      await pool.end();
    }
  });

  test('bad numbers are usage errors naming the option', async () => {
    const run = await mailroom(['bench', '--jobs', '0']);
    assert.equal(run.code, 2);
    assert.match(run.stderr, /option --jobs: expected a whole number from 1 to 10000000, got "0"/);
  });
});
