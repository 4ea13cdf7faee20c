/**
 * A tiny run of the benchmark (`npm run bench`), mailroom only, so the harness
 * cannot rot between real runs. It measures nothing worth reading: it checks
 * that every workload runs, drains every job exactly once and reports it.
 * Needs PostgreSQL (the benchmark creates and drops a database per measurement).
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const databaseUrl = process.env.TEST_DATABASE_URL;
const MAIN = fileURLToPath(new URL('../bench/main.ts', import.meta.url));
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const TSX = import.meta.resolve('tsx');

interface Measured<T> {
  ok: boolean;
  value?: T;
  error?: string;
}
interface Drain {
  jobs: number;
  jobsPerSecond: number;
  duplicates: number;
  failed: number;
}
interface Latency {
  jobs: number;
  p50Ms: number;
  p99Ms: number;
  missing: number;
}
interface Scale {
  jobs: number;
  jobsPerSecond: number;
  orderingKeys: number | null;
  completedInDatabase: number;
  rounds?: number[];
}
interface BenchJson {
  drain: Record<string, Measured<Drain>>;
  latency: Record<string, Measured<Latency>>;
  scale: { processes: Measured<Scale>[]; ordered?: Measured<Scale>; backlogs: Measured<Scale>[] };
}

function value<T>(m: Measured<T> | undefined, what: string): T {
  assert.ok(m, `${what}: no result`);
  assert.ok(m.ok && m.value, `${what} failed: ${m.error ?? 'no value'}`);
  return m.value;
}

test('the benchmark runs end to end at a tiny size (mailroom only)', { skip: databaseUrl ? false : 'needs TEST_DATABASE_URL', timeout: 180_000 }, async () => {
  const args = [
    ...['--import', TSX, MAIN, '--quick', '--json', '--systems', 'mailroom', '--only', 'drain,latency,scale'],
    ...['--database', databaseUrl!, '--jobs', '300', '--latency-jobs', '30', '--scale-jobs', '300'],
    ...['--processes', '1', '--backlogs', '300,600', '--rounds', '2', '--ordering-keys', '10'],
  ];
  const child = spawn(process.execPath, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c)));
  assert.equal(code, 0, `bench exited with ${code}\n${stderr}`);
  const results = JSON.parse(stdout) as BenchJson;

  const drain = value(results.drain.mailroom, 'drain');
  assert.equal(drain.jobs, 300);
  assert.equal(drain.duplicates, 0);
  assert.equal(drain.failed, 0);
  assert.ok(drain.jobsPerSecond > 0);

  const latency = value(results.latency.mailroom, 'latency');
  assert.equal(latency.missing, 0);
  assert.ok(latency.p50Ms > 0 && latency.p99Ms >= latency.p50Ms);

  const runs = [...results.scale.processes, results.scale.ordered, ...results.scale.backlogs];
  assert.equal(runs.length, 4);
  for (const run of runs) {
    const scale = value(run, 'scale');
    assert.equal(scale.completedInDatabase, scale.jobs, 'every job of the scale run is completed in the database');
  }
  assert.equal(value(results.scale.ordered, 'ordered').orderingKeys, 10);
  // The backlogs take turns within each round (so the machine's drift weighs on both alike), and
  // each backlog's result gathers its own rounds.
  const order = [...stderr.matchAll(/backlog (\d+), round (\d+)/g)].map((m) => `${m[1]}/${m[2]}`);
  assert.deepEqual(order, ['300/1', '600/1', '300/2', '600/2']);
  assert.deepEqual(results.scale.backlogs.map((b) => [value(b, 'backlog').jobs, value(b, 'backlog').rounds?.length]), [[300, 2], [600, 2]]);
});
