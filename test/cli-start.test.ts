/**
 * `mailroom start`, run as a real child process from the config files in
 * test/fixtures/config/: a .ts config whose worker writes effect rows through
 * ctx.tx (jobs processed, /metrics and /healthz served, SIGTERM lets the
 * running job commit and exits 0), a .json config found in the current
 * directory, config mistakes (exit 2 naming the file, line and fix), start
 * failures (exit 1: port in use, database unreachable, schema not migrated) and
 * a SIGTERM while a background pass waits for a lock (exits within
 * shutdownTimeout, naming the cancelled pass).
 * PostgreSQL when TEST_DATABASE_URL is set, else the embedded database (which
 * the test opens only while the child is not running: PGlite is one process's).
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, watch, writeFileSync, type FSWatcher } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test, type TestContext } from 'node:test';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { createMailroom, type Mailroom } from '../src/index.ts';
import { effectsTable, work } from './fixtures/config/jobs.ts';
import { eventsTable, noted } from './fixtures/config/events.ts';
import { openPglite } from '../src/storage/pglite-open.ts';
import { freePort } from './helpers/brokers/free-port.ts';
import { WASM_FLAGS } from './helpers/wasm-flags.ts';

const MAIN = fileURLToPath(new URL('../src/cli/main.ts', import.meta.url));
const TSX = import.meta.resolve('tsx');
const FIXTURES = fileURLToPath(new URL('./fixtures/config/', import.meta.url));
const databaseUrl = process.env.TEST_DATABASE_URL;

const dirs: string[] = [];
let pool: pg.Pool | undefined;
const schemas: string[] = [];
let counter = 0;
let embeddedDir: string | undefined;

after(async () => {
  for (const watcher of watchers) watcher.close();
  if (pool) {
    for (const schema of schemas) await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => {});
    await pool.end();
  }
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'mailroom-start-'));
  dirs.push(dir);
  return dir;
}

function uniqueSchema(): string {
  return `start_${process.pid}_${Date.now().toString(36)}_${(counter++).toString(36)}`;
}

/** A running `mailroom ...args` child: its output so far, and its exit. */
class Child {
  stdout = '';
  stderr = '';
  readonly exited: Promise<number | null>;
  private readonly process: ChildProcess;

  constructor(args: string[], options: { cwd?: string; env?: Record<string, string> }) {
    const env: NodeJS.ProcessEnv = { ...process.env, ...options.env };
    delete env.DATABASE_URL; // the embedded default must not turn into someone's server
    this.process = spawn(process.execPath, [...WASM_FLAGS, '--import', TSX, MAIN, ...args], { cwd: options.cwd ?? process.cwd(), env, stdio: ['ignore', 'pipe', 'pipe'] });
    this.process.stdout!.on('data', (chunk: Buffer) => (this.stdout += chunk.toString()));
    this.process.stderr!.on('data', (chunk: Buffer) => (this.stderr += chunk.toString()));
    this.exited = new Promise((resolve, reject) => {
      this.process.on('error', reject);
      this.process.on('close', (code) => resolve(code));
    });
  }

  get output(): string {
    return `\nstdout:\n${this.stdout}\nstderr:\n${this.stderr}`;
  }

  signal(signal: NodeJS.Signals): void {
    this.process.kill(signal);
  }

  /** Kills it if it still runs (test cleanup). */
  stop(): void {
    if (this.process.exitCode === null && this.process.signalCode === null) this.process.kill('SIGKILL');
  }

  /** Resolves with `waiting`, or fails with the child's output if it exits first or `timeoutMs` passes. */
  async until<T>(waiting: Promise<T>, what: string, timeoutMs = 30_000): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}${this.output}`)), timeoutMs);
    });
    const exit = this.exited.then((code) => Promise.reject(new Error(`mailroom exited (${code}) while the test waited for ${what}${this.output}`)));
    try {
      return await Promise.race([waiting, timeout, exit]);
    } finally {
      clearTimeout(timer);
      exit.catch(() => {});
    }
  }

  /** The first stdout match of `pattern`, once it has been printed. */
  printed(pattern: RegExp): Promise<RegExpMatchArray> {
    return this.until(
      new Promise<RegExpMatchArray>((resolve) => {
        const check = () => {
          const match = pattern.exec(this.stdout);
          if (!match) return false;
          this.process.stdout!.off('data', onData);
          resolve(match);
          return true;
        };
        const onData = () => void setImmediate(check);
        this.process.stdout!.on('data', onData);
        check();
      }),
      `${pattern} on stdout`,
    );
  }
}

function run(args: string[], options: { cwd?: string; env?: Record<string, string> } = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = new Child(args, options);
  return child.exited.then((code) => ({ code, stdout: child.stdout, stderr: child.stderr }));
}

const watchers = new Set<FSWatcher>();

/** Resolves once every file of `names` exists in `dir` (the handler's markers). */
function files(dir: string, names: string[]): Promise<void> {
  return new Promise((resolve) => {
    const all = () => names.every((name) => existsSync(join(dir, name)));
    const done = () => {
      watcher.close();
      watchers.delete(watcher);
      resolve();
    };
    const watcher = watch(dir, () => {
      if (all()) done();
    });
    watchers.add(watcher);
    if (all()) done();
  });
}

type Sql = <R = Record<string, unknown>>(text: string, params?: unknown[]) => Promise<R[]>;

/** The database the child uses, and a way for the test to use it too. */
interface Db {
  schema: string;
  /** How the child is told about it. */
  args: string[];
  /** Whether the test may use it while the child runs (a server: yes; embedded PGlite: no). */
  shared: boolean;
  /** Runs `fn` with a migrated mailroom on it (embedded: opened and closed around `fn`). */
  use<T>(fn: (mailroom: Mailroom, sql: Sql) => Promise<T>): Promise<T>;
}

async function makeDb(t: TestContext): Promise<Db> {
  const schema = uniqueSchema();
  if (databaseUrl) {
    pool ??= new pg.Pool({ connectionString: databaseUrl, max: 4 });
    schemas.push(schema);
    const mailroom = await createMailroom({ database: pool, schema });
    await mailroom.migrate();
    t.after(() => mailroom.close({ timeout: 1000 }));
    const sql: Sql = async (text, params) => (await pool!.query(text, params)).rows;
    return { schema, args: ['--database', databaseUrl], shared: true, use: (fn) => fn(mailroom, sql) };
  }
  // One embedded database for the file (creating one takes seconds); each test has its own schema in it.
  embeddedDir ??= tempDir();
  const dir = embeddedDir;
  return {
    schema,
    args: ['--data-dir', dir],
    shared: false,
    async use(fn) {
      const { db } = await openPglite(dir);
      try {
        const mailroom = await createMailroom({ database: db, schema });
        try {
          await mailroom.migrate();
          return await fn(mailroom, async (text, params) => (await db.query(text, params)).rows as never);
        } finally {
          await mailroom.close({ timeout: 1000 });
        }
      } finally {
        await db.close();
      }
    },
  };
}

/** Samples of one metric in Prometheus text: labels and value. */
function samples(text: string, name: string): { labels: Record<string, string>; value: number }[] {
  const found: { labels: Record<string, string>; value: number }[] = [];
  for (const line of text.split('\n')) {
    const match = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!match || match[1] !== name) continue;
    const labels = Object.fromEntries([...(match[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((m) => [m[1]!, m[2]!]));
    found.push({ labels, value: Number(match[3]) });
  }
  return found;
}

function lineOf(file: string, needle: string): number {
  const index = readFileSync(join(FIXTURES, file), 'utf8').split('\n').findIndex((line) => line.includes(needle));
  assert.ok(index >= 0, `${needle} is in ${file}`);
  return index + 1;
}

test('start from a .ts config: runs the jobs, serves /metrics and /healthz, and SIGTERM lets the running job commit', async (t) => {
  const db = await makeDb(t);
  const markers = tempDir();
  const quick = [0, 1, 2, 3, 4];
  await db.use(async (mailroom, sql) => {
    await sql(`CREATE TABLE ${effectsTable(db.schema)} (n int NOT NULL, job_id text NOT NULL)`);
    await mailroom.enqueueMany(work, quick.map((n) => ({ n })));
    await mailroom.enqueue(work, { n: 100, sleepMs: 300, gate: 'go-100' }); // runs ~300 ms once the gate opens
    await mailroom.enqueue(work, { n: 101, gate: 'release-101' }); // runs until the test releases it
  });
  const port = await freePort();
  const child = new Child(['start', '--config', join(FIXTURES, 'mailroom.config.ts'), ...db.args, '--port', String(port)], {
    env: { MAILROOM_TEST_SCHEMA: db.schema, MAILROOM_TEST_MARKERS: markers },
  });
  t.after(() => child.stop());
  await child.printed(/^running;/m);
  assert.match(child.stdout, /^worker \S+: queues cfgtest, concurrency 4, 1 job type, with maintenance$/m, child.output);
  const url = (await child.printed(/^metrics: (\S+)/m))[1];
  assert.equal(url, `http://127.0.0.1:${port}/metrics`, '--port overrides the default 9464');
  const healthz = `http://127.0.0.1:${port}/healthz`;
  const healthy = await fetch(healthz);
  assert.equal(healthy.status, 200);
  assert.equal(await healthy.text(), 'ok\n');

  const processed = [...quick];
  if (db.shared) {
    // A server: also jobs enqueued while it runs.
    await db.use((mailroom) => mailroom.enqueueMany(work, [10, 11, 12].map((n) => ({ n }))));
    processed.push(10, 11, 12);
  }
  await child.until(files(markers, [...processed.map((n) => `done-${n}`), 'started-100', 'started-101']), 'the jobs to run');

  // Prometheus text from mailroom.metrics(): completions counted by this process, depth by state read
  // from the database (both gated jobs active). Completions commit in batches after the handler's
  // marker, and one stats() result serves scrapes for 1 s: scrape until both have caught up.
  let body = '';
  let completed = 0;
  let active: ReturnType<typeof samples>[number] | undefined;
  const deadline = Date.now() + 10_000;
  for (;;) {
    const res = await fetch(url!);
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /^text\/plain; version=0\.0\.4/);
    body = await res.text();
    completed = samples(body, 'mailroom_jobs_completed_total').filter((s) => s.labels.queue === 'cfgtest').reduce((sum, s) => sum + s.value, 0);
    active = samples(body, 'mailroom_jobs').find((s) => s.labels.queue === 'cfgtest' && s.labels.state === 'active');
    if ((completed === processed.length && active?.value === 2) || Date.now() > deadline) break;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  assert.equal(completed, processed.length, `mailroom_jobs_completed_total counts the completed jobs\n${body}`);
  assert.match(body, /^# TYPE mailroom_jobs gauge$/m);
  assert.deepEqual(active, { labels: { queue: 'cfgtest', owner: 'platform', state: 'active' }, value: 2 }, 'the two gated jobs run; the owner comes from the config');

  // SIGTERM while job 100 runs: it finishes and commits, /healthz says 503 while stopping, exit 0.
  writeFileSync(join(markers, 'go-100'), '');
  await child.until(files(markers, ['running-100']), 'job 100 to pass its gate');
  assert.equal(existsSync(join(markers, 'done-100')), false, 'the signal must arrive while job 100 runs');
  child.signal('SIGTERM');
  await child.printed(/^stopping \(SIGTERM\)/m);
  const stopping = await fetch(healthz);
  assert.equal(stopping.status, 503);
  assert.equal(await stopping.text(), 'stopping\n');
  writeFileSync(join(markers, 'release-101'), '');
  assert.equal(await child.until(child.exited, 'the exit'), 0, child.output);
  assert.match(child.stdout, /^stopped$/m);

  await db.use(async (_mailroom, sql) => {
    const effects = await sql<{ n: number; c: number }>(`SELECT n, count(*)::int AS c FROM ${effectsTable(db.schema)} GROUP BY n ORDER BY n`);
    assert.deepEqual(
      effects,
      [...processed, 100, 101].map((n) => ({ n, c: 1 })),
      'every job took effect once, the in-flight ones included',
    );
    const states = await sql<{ state: string; c: number }>(`SELECT state, count(*)::int AS c FROM "${db.schema}".jobs GROUP BY state`);
    assert.deepEqual(states, [{ state: 'completed', c: processed.length + 2 }]);
  });
});

test('start from the mailroom.config.json of the current directory, with a relay; SIGINT exits 0 (--json lines)', async (t) => {
  const db = await makeDb(t);
  const cwd = tempDir();
  const config = JSON.parse(readFileSync(join(FIXTURES, 'basic.config.json'), 'utf8')) as Record<string, unknown>;
  writeFileSync(join(cwd, 'mailroom.config.json'), JSON.stringify({ ...config, schema: db.schema }, null, 2));
  const port = await freePort();
  const child = new Child(['start', ...db.args, '--port', String(port), '--json'], { cwd });
  t.after(() => child.stop());
  await child.printed(/"event":"running"/);
  const lines = child.stdout.trim().split('\n').map((line) => JSON.parse(line) as { event: string; [k: string]: unknown });
  assert.deepEqual(lines.map((l) => l.event), ['config', 'database', 'relay', 'metrics', 'running'], child.output);
  assert.equal(lines[0]!.file, join(cwd, 'mailroom.config.json'));
  assert.equal(lines[1]!.schema, db.schema);
  assert.deepEqual(lines[2]!.targets, ['internal']);
  assert.equal(lines[3]!.url, `http://127.0.0.1:${port}/metrics`);
  assert.equal((await fetch(`http://127.0.0.1:${port}/healthz`)).status, 200);
  const metrics = await fetch(`http://127.0.0.1:${port}/metrics`);
  assert.match(await metrics.text(), /^# TYPE mailroom_relay_unpublished gauge$/m);
  child.signal('SIGINT');
  assert.equal(await child.until(child.exited, 'the exit'), 0, child.output);
  assert.deepEqual(
    child.stdout.trim().split('\n').slice(-2).map((line) => (JSON.parse(line) as { event: string }).event),
    ['stopping', 'stopped'],
  );
});

test('start from an .mjs config with a consumer group and a relay: every event published while it runs takes effect once', { skip: databaseUrl ? false : 'needs TEST_DATABASE_URL: the test publishes while start runs' }, async (t) => {
  const db = await makeDb(t);
  await db.use((_mailroom, sql) => sql(`CREATE TABLE ${eventsTable(db.schema)} (event_id uuid NOT NULL, n int NOT NULL)`));
  const child = new Child(['start', '--config', join(FIXTURES, 'consumer.config.mjs'), ...db.args], { env: { MAILROOM_TEST_SCHEMA: db.schema } });
  t.after(() => child.stop());
  await child.printed(/^running;/m);
  assert.match(child.stdout, /^consumer group cfg-ledger: cfgtest.noted from the outbox \(internal\)$/m, child.output);
  assert.match(child.stdout, /^relay \S+: targets internal/m, child.output);
  assert.doesNotMatch(child.stdout, /^metrics:/m, 'metrics: false serves no endpoint');
  const ids = await db.use(async (mailroom) => (await mailroom.publishMany(noted, [1, 2, 3, 4, 5].map((n) => ({ n })))).ids);
  const deadline = Date.now() + 20_000;
  let rows: { event_id: string; n: number }[] = [];
  while (Date.now() < deadline) {
    rows = await db.use((_mailroom, sql) => sql<{ event_id: string; n: number }>(`SELECT event_id, n FROM ${eventsTable(db.schema)} ORDER BY n`));
    if (rows.length >= 5) break;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  child.signal('SIGTERM');
  assert.equal(await child.until(child.exited, 'the exit'), 0, child.output);
  assert.deepEqual(rows.map((r) => [r.event_id, r.n]), ids.map((id, i) => [id, i + 1]), `each event once\n${child.output}`);
});

test('SIGTERM while the relay\'s prune waits for a lock another session holds: start exits within shutdownTimeout and names the cancelled pass', { skip: databaseUrl ? false : 'needs TEST_DATABASE_URL: a lock from another session' }, async (t) => {
  const db = await makeDb(t);
  const cwd = tempDir();
  const config = JSON.parse(readFileSync(join(FIXTURES, 'basic.config.json'), 'utf8')) as Record<string, unknown>;
  // A retention of 5 s prunes every second; the outbox's SHARE lock holds the prune's DELETE and lets the relay read.
  writeFileSync(join(cwd, 'mailroom.config.json'), JSON.stringify({ ...config, schema: db.schema, relay: { pollInterval: '200ms', retention: '5s' }, shutdownTimeout: '1s' }));
  const locker = new pg.Client({ connectionString: databaseUrl });
  await locker.connect();
  t.after(() => locker.end());
  await locker.query('BEGIN');
  await locker.query(`LOCK TABLE "${db.schema}".outbox IN SHARE MODE`);
  const child = new Child(['start', ...db.args, '--port', String(await freePort())], { cwd });
  t.after(() => child.stop());
  await child.printed(/^running;/m);
  const deadline = Date.now() + 15_000;
  for (;;) {
    await locker.query('SELECT pg_stat_clear_snapshot()');
    const { rows } = await locker.query(
      `SELECT count(*)::int AS n FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
        WHERE NOT l.granted AND l.relation = $1::regclass AND a.query LIKE 'DELETE%'`,
      [`"${db.schema}".outbox`],
    );
    if (rows[0].n > 0) break;
    assert.ok(Date.now() < deadline, `the relay's prune did not wait for the lock within 15 s${child.output}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  const began = Date.now();
  child.signal('SIGTERM');
  assert.equal(await child.until(child.exited, 'the exit', 15_000), 0, child.output);
  const took = Date.now() - began;
  assert.ok(took < 8000, `start took ${took} ms to exit with shutdownTimeout 1s while the lock was held${child.output}`);
  assert.match(child.stdout + child.stderr, /the outbox prune pass was cancelled: stop\(\) waited 1000 ms for it/, child.output);
  await locker.query('COMMIT');
});

test('start serves the dashboard of its config (token from MAILROOM_DASHBOARD_TOKEN, read-only); a short token in the config exits 2 naming dashboard.token, one in the environment naming the variable', async (t) => {
  const db = await makeDb(t);
  const cwd = tempDir();
  const config = JSON.parse(readFileSync(join(FIXTURES, 'basic.config.json'), 'utf8')) as Record<string, unknown>;
  const port = await freePort();
  writeFileSync(join(cwd, 'mailroom.config.json'), JSON.stringify({ ...config, schema: db.schema, dashboard: { port, readOnly: true } }, null, 2));
  const token = 'start-dashboard-token-0123456789';
  const child = new Child(['start', ...db.args, '--no-metrics', '--json'], { cwd, env: { MAILROOM_DASHBOARD_TOKEN: token } });
  t.after(() => child.stop());
  await child.printed(/"event":"running"/);
  const lines = child.stdout.trim().split('\n').map((line) => JSON.parse(line) as { event: string; [k: string]: unknown });
  const shown = lines.find((l) => l.event === 'dashboard');
  assert.ok(shown, child.output);
  assert.equal(shown.url, `http://127.0.0.1:${port}/`, 'a token from the environment is not printed');
  assert.equal(shown.readOnly, true);
  assert.equal((await fetch(`http://127.0.0.1:${port}/api/meta`)).status, 401);
  const meta = (await (await fetch(`http://127.0.0.1:${port}/api/meta`, { headers: { authorization: `Bearer ${token}` } })).json()) as { readOnly: boolean; schema: string };
  assert.deepEqual([meta.readOnly, meta.schema], [true, db.schema]);
  child.signal('SIGINT');
  assert.equal(await child.until(child.exited, 'the exit'), 0, child.output);
  await assert.rejects(fetch(`http://127.0.0.1:${port}/api/meta`), 'the dashboard stopped with start');

  const taken = createServer().listen(port, '127.0.0.1');
  await new Promise((resolve) => taken.once('listening', resolve));
  try {
    const busy = await run(['start', ...db.args, '--no-metrics'], { cwd, env: { MAILROOM_DASHBOARD_TOKEN: token } });
    assert.equal(busy.code, 1, busy.stderr);
    assert.match(busy.stderr, new RegExp(`port ${port} on 127\\.0\\.0\\.1 is taken; pick another port`));
  } finally {
    taken.close();
  }

  writeFileSync(join(cwd, 'mailroom.config.json'), JSON.stringify({ ...config, schema: db.schema, dashboard: { token: 'short' } }, null, 2));
  const bad = await run(['start', ...db.args, '--no-metrics'], { cwd });
  assert.equal(bad.code, 2, bad.stderr);
  assert.match(bad.stderr, /dashboard\.token: .*at least 16 characters/);
  // A short token from the environment: a usage error naming the variable, before anything starts.
  writeFileSync(join(cwd, 'mailroom.config.json'), JSON.stringify({ ...config, schema: db.schema, dashboard: { port } }, null, 2));
  const badEnv = await run(['start', ...db.args, '--no-metrics'], { cwd, env: { MAILROOM_DASHBOARD_TOKEN: 'short' } });
  assert.equal(badEnv.code, 2, badEnv.stderr);
  assert.match(badEnv.stderr, /^mailroom start: MAILROOM_DASHBOARD_TOKEN must be a string of at least 16 characters without spaces; it has 5 characters$/m);
  assert.doesNotMatch(badEnv.stdout, /"event":"running"|running/);
});

test('config mistakes exit 2 and name the file, the line and the fix', async () => {
  const empty = tempDir();
  const config = (file: string) => ['start', '--config', join(FIXTURES, file), '--no-metrics'];
  const [syntax, badValue, unknown, workers, badTs, throws, missing] = await Promise.all([
    run(config('syntax-error.config.json'), { cwd: FIXTURES }),
    run(config('bad-value.config.json'), { cwd: FIXTURES }),
    run(config('unknown-key.config.json'), { cwd: FIXTURES }),
    run(config('workers.config.json'), { cwd: FIXTURES }),
    run(config('bad-value.config.ts'), { cwd: FIXTURES }),
    run(config('throws.config.ts'), { cwd: FIXTURES }),
    run(['start'], { cwd: empty }),
  ]);
  // JSON syntax: file:line:column of the mistake (a trailing comma, which JSON.parse reports without a position).
  assert.equal(syntax.code, 2, syntax.stderr);
  assert.match(syntax.stderr, new RegExp(`^mailroom start: syntax-error\\.config\\.json:${lineOf('syntax-error.config.json', '}')}:1: invalid JSON: .*trailing comma`, 'm'));
  // A wrong value: the key path and the line of the key.
  assert.equal(badValue.code, 2, badValue.stderr);
  assert.match(badValue.stderr, new RegExp(`bad-value\\.config\\.json:${lineOf('bad-value.config.json', '"port"')}: metrics\\.port: expected a whole number from 0 to 65535, got number 70000`));
  // An unknown key: did you mean.
  assert.equal(unknown.code, 2, unknown.stderr);
  assert.match(unknown.stderr, new RegExp(`unknown-key\\.config\\.json:${lineOf('unknown-key.config.json', '"migrat"')}: migrat: unknown key "migrat"; did you mean "migrate"\\?`));
  // Workers in JSON: the fix is a code config.
  assert.equal(workers.code, 2, workers.stderr);
  assert.match(workers.stderr, new RegExp(`workers\\.config\\.json:${lineOf('workers.config.json', '"workers"')}: workers: .*handlers, which are functions`));
  assert.match(workers.stderr, /hint: write the config as mailroom\.config\.ts/);
  // A code config: the key path (the second worker) and its line, found in the source.
  assert.equal(badTs.code, 2, badTs.stderr);
  assert.match(badTs.stderr, new RegExp(`bad-value\\.config\\.ts:${lineOf('bad-value.config.ts', 'concurrency: 0')}: workers\\[1\\]\\.concurrency: concurrency must be an integer from 1 to 10000, got 0`));
  // A config that throws at import: the file and the first stack line in it.
  assert.equal(throws.code, 2, throws.stderr);
  assert.match(throws.stderr, new RegExp(`throws\\.config\\.ts:${lineOf('throws.config.ts', 'throw new Error')}:\\d+: the config failed while loading: Error: SHOP_DATABASE_URL is not set`));
  // No config at all: how to write one.
  assert.equal(missing.code, 2, missing.stderr);
  assert.match(missing.stderr, /no config file: none of mailroom\.config\.ts, .*mailroom\.config\.json in /);
  assert.match(missing.stderr, /export default defineConfig\(\{/);
});

test('start failures exit 1 and say what to do: port in use, database unreachable, schema not migrated', async (t) => {
  const busy: Server = createServer();
  await new Promise<void>((resolve) => busy.listen(0, '127.0.0.1', resolve));
  t.after(() => busy.close());
  const busyPort = (busy.address() as { port: number }).port;
  const basic = join(FIXTURES, 'basic.config.json');
  const db = await makeDb(t);
  const cwd = tempDir();
  writeFileSync(join(cwd, 'mailroom.config.json'), JSON.stringify({ schema: `${db.schema}_none` }));
  const [portInUse, unreachable, notMigrated] = await Promise.all([
    run(['start', '--config', basic, '--port', String(busyPort), '--data-dir', join(tempDir(), 'db')]),
    run(['start', '--config', basic, '--database', 'postgres://postgres@127.0.0.1:1/mailroom', '--no-metrics']),
    run(['start', ...db.args, '--no-metrics'], { cwd }),
  ]);
  assert.equal(portInUse.code, 1, portInUse.stderr);
  assert.match(portInUse.stderr, new RegExp(`port ${busyPort} is in use.*--port PORT.*--no-metrics`));
  assert.equal(unreachable.code, 1, unreachable.stderr);
  assert.match(unreachable.stderr, /cannot use the database at postgres:\/\/postgres@127\.0\.0\.1:1\/mailroom.*Check that PostgreSQL is running/);
  assert.equal(notMigrated.code, 1, notMigrated.stderr);
  assert.match(notMigrated.stderr, new RegExp(`schema "${db.schema}_none" has no mailroom tables; run \`mailroom migrate\`.*migrate: true`));
});
