/**
 * The `mailroom` command line, run as a real child process: help, usage
 * errors, migrate on the embedded database, and the demo (embedded always;
 * on PostgreSQL with SIGKILLed worker processes when TEST_DATABASE_URL is set),
 * checked against the ledger it prints as JSON.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
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

  test('migrate reads the database and schema from the config file, as start and status do (flags first)', async () => {
    const here = join(dir, 'with-config');
    mkdirSync(here);
    writeFileSync(join(here, 'mailroom.config.json'), JSON.stringify({ schema: 'cli_config_schema' }));
    const run = await mailroom(['migrate', '--json'], { cwd: here, timeoutMs: 60_000 });
    assert.equal(run.code, 0, run.stderr);
    assert.equal(parseJson<{ schema: string }>(run, 'migrate --json').schema, 'cli_config_schema');
    const status = await mailroom(['status', '--json'], { cwd: here, timeoutMs: 60_000 });
    assert.equal(status.code, 0, `status finds the tables migrate made: ${status.stderr}`);
    const flag = await mailroom(['migrate', '--schema', 'cli_flag_schema', '--json'], { cwd: here, timeoutMs: 60_000 });
    assert.equal(parseJson<{ schema: string }>(flag, 'migrate --json').schema, 'cli_flag_schema', 'a flag wins over the config');
    const named = await mailroom(['migrate', '--config', join(here, 'nope.config.json')], { cwd: here, timeoutMs: 60_000 });
    assert.equal(named.code, 2, 'a --config that does not exist is a usage error');
    assert.match(named.stderr, /nope\.config\.json/);
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
      config: string | null;
      checked: string[];
      unchecked: string[];
      warnings: { code: string; subject: string; message: string; check: string }[];
      failures: { subject: string; message: string }[];
      note?: string;
    }
    /** The adapter modules as a config file in a temp directory imports them. */
    // The built adapters, as the built binary that loads the config has them.
    const adapterModule = (broker: string) => JSON.stringify(new URL(`../dist/brokers/${broker}/index.js`, import.meta.url).href);
    let configs: string;
    let configCount = 0;
    before(() => {
      configs = mkdtempSync(join(tmpdir(), 'mailroom-doctor-'));
    });
    after(() => rmSync(configs, { recursive: true, force: true }));
    /** Writes `text` as `name` in a fresh directory of its own and returns the file's path. */
    const writeConfig = (name: string, text: string): string => {
      const here = join(configs, String(++configCount));
      mkdirSync(here);
      writeFileSync(join(here, name), text);
      return join(here, name);
    };

    test('usage: no broker and no config, or a broker without what to check, exits 2 and says what is missing', async () => {
      const none = await mailroom(['doctor'], { cwd: dir });
      assert.equal(none.code, 2);
      assert.match(none.stderr, /name at least one broker or a database to check, or a config file with --config/);
      const lease = await mailroom(['doctor', '--lease', '2m'], { cwd: dir });
      assert.equal(lease.code, 2);
      assert.match(lease.stderr, /--lease goes with --rabbitmq, --nats or --redis/);
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

    test('config: a relay target whose checked queue has no delivery limit exits 1 naming the entry; with flags both are checked; a clean config passes', { skip: rabbitUrl && redisUrl ? false : 'RABBITMQ_URL and REDIS_URL are needed' }, async () => {
      const amqp = await import('amqplib');
      const queue = `doctor-cfg-plain-${process.pid}`;
      const connection = await amqp.connect(rabbitUrl!);
      try {
        const channel = await connection.createChannel();
        await channel.assertQueue(queue, { durable: true }); // classic, no x-delivery-limit, no dead-letter exchange
        const text = (name: string, checkQueues: string[]) =>
          `import { rabbitmq } from ${adapterModule('rabbitmq')};\n` +
          `export default { relay: { to: [rabbitmq({ url: ${JSON.stringify(rabbitUrl)}, exchange: 'amq.topic', name: ${JSON.stringify(name)}, checkQueues: ${JSON.stringify(checkQueues)} })] } };\n`;
        const file = writeConfig('shop.config.mjs', text('rabbitmq:shop', [queue]));
        const run = await mailroom(['doctor', '--config', file]);
        assert.equal(run.code, 1, run.stdout + run.stderr);
        assert.match(run.stdout, /^config: .*shop\.config\.mjs$/m);
        assert.match(run.stdout, new RegExp(`^warning rabbitmq-no-delivery-limit: rabbitmq \\S+ queue ${queue} \\(relay target rabbitmq:shop\\)$`, 'm'));
        assert.match(run.stdout, /^1 warning\(s\), 0 check\(s\) that could not run\.$/m);

        // Flags: --queue is a queue a mailroom consumer reads (it needs no delivery limit), --check-queue one other services read.
        const ours = await mailroom(['doctor', '--rabbitmq', rabbitUrl!, '--exchange', 'amq.topic', '--queue', queue, '--json']);
        assert.equal(ours.code, 0, ours.stdout + ours.stderr);
        assert.deepEqual(parseJson<DoctorReport>(ours, 'doctor --json').checked, ['rabbitmq exchange amq.topic', `rabbitmq queue ${queue}`]);
        const theirs = await mailroom(['doctor', '--rabbitmq', rabbitUrl!, '--exchange', 'amq.topic', '--check-queue', queue, '--json']);
        assert.equal(theirs.code, 1, theirs.stdout + theirs.stderr);
        assert.deepEqual(parseJson<DoctorReport>(theirs, 'doctor --json').warnings.map((w) => w.code), ['rabbitmq-no-delivery-limit']);
        const alone = await mailroom(['doctor', '--rabbitmq', rabbitUrl!, '--queue', queue, '--check-queue', queue]);
        assert.equal(alone.code, 2);
        assert.match(alone.stderr, /--check-queue goes with --exchange/);

        // Broker flags and a config: both are checked, each finding names where it came from.
        const both = await mailroom(['doctor', '--config', file, '--redis', redisUrl!, '--redis-stream', 'doctor-test', '--json']);
        assert.equal(both.code, 1, both.stdout + both.stderr);
        const report = parseJson<DoctorReport>(both, 'doctor --json');
        assert.deepEqual(report.checked, ['redis stream doctor-test', 'relay target rabbitmq:shop']);
        assert.deepEqual(report.warnings.map((w) => [w.code, w.check]), [['redis-no-persistence', 'redis stream doctor-test'], ['rabbitmq-no-delivery-limit', 'relay target rabbitmq:shop']]);
        assert.match(report.config ?? '', /shop\.config\.mjs$/);

        // The mailroom.config.* of the current directory: read without broker flags, left alone with them (unless --config).
        const cwd = join(configs, 'found-here');
        mkdirSync(cwd);
        writeFileSync(join(cwd, 'mailroom.config.mjs'), text('rabbitmq:shop', [queue]));
        const here = await mailroom(['doctor', '--json'], { cwd });
        assert.equal(here.code, 1, here.stdout + here.stderr);
        assert.deepEqual(parseJson<DoctorReport>(here, 'doctor --json').warnings.map((w) => w.check), ['relay target rabbitmq:shop']);
        assert.equal(parseJson<DoctorReport>(here, 'doctor --json').config, 'mailroom.config.mjs');
        const flagsOnly = await mailroom(['doctor', '--rabbitmq', rabbitUrl!, '--exchange', 'amq.topic', '--json'], { cwd });
        assert.equal(flagsOnly.code, 0, flagsOnly.stdout + flagsOnly.stderr);
        assert.deepEqual(parseJson<DoctorReport>(flagsOnly, 'doctor --json').checked, ['rabbitmq exchange amq.topic']);

        const clean = await mailroom(['doctor', '--config', writeConfig('clean.config.mjs', text('rabbitmq:clean', []))]);
        assert.equal(clean.code, 0, clean.stdout + clean.stderr);
        assert.match(clean.stdout, /^No problems found \(relay target rabbitmq:clean\)\.$/m);
      } finally {
        const channel = await connection.createChannel();
        await channel.deleteQueue(queue).catch(() => undefined);
        await connection.close();
      }
    });

    test("config: the relay's lease sets the duplicate window a NATS target needs, maxPayloadBytes the message size it must take; a consumer's source is checked for its group", { skip: natsUrl ? false : 'NATS_URL is not set' }, async () => {
      const { connect } = await import('@nats-io/transport-node');
      const { AckPolicy, jetstreamManager } = await import('@nats-io/jetstream');
      const nc = await connect({ servers: natsUrl! });
      const jsm = await jetstreamManager(nc);
      const stream = `doctor-cfg-${process.pid}`;
      const group = `doctor-billing-${process.pid}`;
      try {
        await jsm.streams.add({ name: stream, subjects: [`${stream}.>`], duplicate_window: 60_000_000_000 });
        // The durable the group reads (named after the group: the source has no durable option), limited to 3 deliveries.
        await jsm.consumers.add(stream, { durable_name: group, ack_policy: AckPolicy.Explicit, max_deliver: 3 });
        const text = (lease: string, maxPayloadBytes = 500_000) =>
          `import { nats, natsSource } from ${adapterModule('nats')};\n` +
          `const url = ${JSON.stringify(natsUrl)};\n` +
          `export default {\n` +
          `  maxPayloadBytes: ${maxPayloadBytes},\n` +
          `  relay: { lease: ${JSON.stringify(lease)}, to: [nats({ url, stream: ${JSON.stringify(stream)}, declare: false })] },\n` +
          `  consumers: [{ group: ${JSON.stringify(group)}, source: natsSource({ url, stream: ${JSON.stringify(stream)} }), handlers: { 'order.placed': async () => {} } }],\n` +
          `};\n`;
        // A 2 minute lease: a republish can come 125 s later, past the 60 s window.
        const long = await mailroom(['doctor', '--config', writeConfig('mailroom.config.mjs', text('2m')), '--json']);
        assert.equal(long.code, 1, long.stdout + long.stderr);
        const report = parseJson<DoctorReport>(long, 'doctor --json');
        assert.deepEqual(report.checked, [`relay target nats:${stream}`, `consumer ${group} source nats ${stream}`]);
        assert.deepEqual(report.warnings.map((w) => [w.code, w.check]), [
          ['nats-duplicate-window', `relay target nats:${stream}`],
          ['nats-max-deliver', `consumer ${group} source nats ${stream}`],
        ]);
        assert.match(report.warnings[0]!.message, /less than the 125 s after which the relay may publish an event again/);
        // The default 30 s lease (35 s horizon) is covered by the window: only the consumer's finding is left.
        const short = await mailroom(['doctor', '--config', writeConfig('mailroom.config.mjs', text('30s'))]);
        assert.equal(short.code, 1, short.stdout + short.stderr);
        assert.doesNotMatch(short.stdout, /nats-duplicate-window/);
        assert.match(short.stdout, new RegExp(`^warning nats-max-deliver: nats \\S+ stream ${stream} consumer ${group} \\(consumer ${group} source nats ${stream}\\)$`, 'm'));
        // The default maxPayloadBytes (1 MiB) with its envelope does not fit the server's default max_payload (1 MB).
        const big = await mailroom(['doctor', '--config', writeConfig('mailroom.config.mjs', text('30s', 1024 * 1024)), '--json']);
        const sizeWarning = parseJson<DoctorReport>(big, 'doctor --json').warnings.find((w) => w.code === 'nats-max-payload');
        assert.ok(sizeWarning, big.stdout + big.stderr);
        assert.match(sizeWarning.message, /publish accepts payloads of up to 1048576 bytes .* does not fit the server's max_payload \(1048576 bytes\).* Lower maxPayloadBytes to 1044480 or less/);
      } finally {
        await jsm.streams.delete(stream).catch(() => false);
        await nc.close();
      }
    });

    test('config without brokers: exit 0 saying there is nothing to check (and which entries have no check())', async () => {
      const json = writeConfig('mailroom.config.json', '{ "relay": {} }\n');
      const plain = await mailroom(['doctor', '--config', json]);
      assert.equal(plain.code, 0, plain.stdout + plain.stderr);
      assert.match(plain.stdout, /^Nothing to check in .*mailroom\.config\.json: no relay target or consumer source on a broker\.$/m);
      assert.doesNotMatch(plain.stdout, /No problems found/);
      const custom = writeConfig('mailroom.config.mjs', "export default { relay: { to: [{ name: 'audit', publish: async () => {} }] } };\n");
      const run = await mailroom(['doctor', '--json'], { cwd: join(custom, '..') });
      assert.equal(run.code, 0, run.stdout + run.stderr);
      const report = parseJson<DoctorReport>(run, 'doctor --json');
      assert.deepEqual([report.ok, report.checked, report.unchecked], [true, [], ['relay target audit']]);
      assert.equal(report.note, 'Nothing to check in mailroom.config.mjs: no relay target or consumer source on a broker; relay target audit has no check().');
    });

    test('a config that fails to load: exit 2 with the error status gives for the same file', async () => {
      const broken = writeConfig('mailroom.config.json', '{\n  "relay": {},\n}\n');
      const throws = writeConfig('throws.config.mjs', "const url = process.env.DOCTOR_UNSET_URL;\nif (!url) throw new Error('DOCTOR_UNSET_URL is not set');\nexport default {};\n");
      for (const [args, expected] of [
        [['--config', broken], /mailroom\.config\.json:3:1: invalid JSON/],
        [['--config', throws], /throws\.config\.mjs:2:\d+: the config failed while loading: Error: DOCTOR_UNSET_URL is not set/],
        [['--config', join(configs, 'missing.config.ts')], /config file not found \(--config .*missing\.config\.ts\)/],
      ] as const) {
        const [doctor, status] = await Promise.all([mailroom(['doctor', ...args]), mailroom(['status', ...args])]);
        assert.equal(doctor.code, 2, doctor.stdout + doctor.stderr);
        assert.match(doctor.stderr, expected);
        assert.equal(doctor.stderr.replace(/^mailroom doctor: /, ''), status.stderr.replace(/^mailroom status: /, ''), 'the same message as status');
        assert.equal(status.code, 2);
      }
      // Found in the current directory, it is read (and refused) the same way.
      const here = await mailroom(['doctor', '--json'], { cwd: join(broken, '..') });
      assert.equal(here.code, 2);
      assert.equal(parseJson<{ error: { kind: string } }>(here, 'doctor --json').error.kind, 'usage');
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
    assert.equal(run.stderr, '', '--json prints no progress');
    // For people: progress of the enqueue and the drain on stderr (lines, stderr not being a terminal here).
    const people = await mailroom(['bench', '--database', databaseUrl!, '--jobs', '300', '--batch-size', '100', '--latency-jobs', '0'], { timeoutMs: 60_000 });
    assert.equal(people.code, 0, people.stderr);
    const lines = people.stderr.trim().split('\n');
    for (const phase of ['enqueue', 'drain']) {
      const own = lines.filter((line) => line.startsWith(`${phase}: `));
      assert.ok(own.every((line) => /^\w+: \d+\/300 \(\d+%\)$/.test(line)), lines.join(' | '));
      assert.equal(own.at(-1), `${phase}: 300/300 (100%)`, `${phase} ends at 100%: ${lines.join(' | ')}`);
    }
    assert.match(people.stdout, /^drain: +[\d,]+ jobs\/s/m);
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
