/**
 * Where an idle worker's enqueue-to-start latency goes: jobs enqueued one at a
 * time at RATE/s to one idle worker; per job the time the enqueue call took,
 * the NOTIFY's arrival on a separate listening connection, and the handler's
 * start, all from just before the enqueue call (ms, p50 / p99).
 *
 *   npm run build && RATE=100 JOBS=1000 npx tsx bench/latency-probe.ts
 *
 * Then the same schedule through a bare queue in raw SQL, the floor of any
 * queue whose claim commits: one connection inserts a row and notifies in one
 * statement (a commit), another, woken by the NOTIFY, claims the oldest row
 * with SKIP LOCKED (a second commit) and counts the start.
 */
import pg from 'pg';
import { createMailroom, defineJob } from '../dist/index.js';
import { createDatabase, dropDatabase } from './db.ts';
import { now, percentile, sleep } from './stats.ts';

const serverUrl = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const RATE = Number(process.env.RATE ?? 100);
const JOBS = Number(process.env.JOBS ?? 1000);
const name = `mrbench_lat_${Date.now().toString(36)}`;
const url = await createDatabase(serverUrl, name);
const mailroom = await createMailroom({ database: url });
try {
  await mailroom.migrate();
  const job = defineJob<{ i: number }>('latency.probe');
  const t0 = new Float64Array(JOBS);
  const enqueued = new Float64Array(JOBS).fill(Number.NaN);
  const notified = new Float64Array(JOBS).fill(Number.NaN);
  const started = new Float64Array(JOBS).fill(Number.NaN);
  let current = -1;
  const listener = new pg.Client(url);
  await listener.connect();
  listener.on('notification', () => {
    if (current >= 0 && Number.isNaN(notified[current]!)) notified[current] = now();
  });
  await listener.query('LISTEN "mailroom_wakeup"');
  const worker = mailroom.worker({ concurrency: 20, handlers: { [job.name]: async (j) => void (started[(j.data as { i: number }).i] = now()) } });
  await worker.start();
  await sleep(1000);
  for (let i = 0; i < JOBS; i++) {
    current = i;
    t0[i] = now();
    await mailroom.enqueue(job, { i });
    enqueued[i] = now();
    const next = t0[i]! + 1000 / RATE;
    await sleep(Math.max(0, next - now()));
  }
  await sleep(500);
  await worker.stop();
  await listener.end();
  const rel = (a: Float64Array) => Array.from(a, (v, i) => v - t0[i]!).filter((v) => !Number.isNaN(v)).sort((x, y) => x - y);
  const show = (label: string, a: Float64Array) => {
    const r = rel(a);
    console.log(`${label.padEnd(22)} p50 ${percentile(r, 50).toFixed(2)}  p99 ${percentile(r, 99).toFixed(2)} ms (${r.length})`);
  };
  show('enqueue resolved', enqueued);
  show('NOTIFY arrived', notified);
  show('handler started', started);

  // The bare queue: same rate and jobs, no library.
  const producer = new pg.Client(url);
  const claimer = new pg.Client(url);
  await Promise.all([producer.connect(), claimer.connect()]);
  await producer.query('CREATE TABLE bare_queue (id bigint PRIMARY KEY, state text NOT NULL DEFAULT \'available\')');
  const bareEnqueued = new Float64Array(JOBS).fill(Number.NaN);
  const bareStarted = new Float64Array(JOBS).fill(Number.NaN);
  let claiming = Promise.resolve();
  claimer.on('notification', () => {
    claiming = claiming.then(async () => {
      const { rows } = await claimer.query<{ id: string }>({
        name: 'claim',
        text: `UPDATE bare_queue SET state = 'running' WHERE id = (SELECT id FROM bare_queue WHERE state = 'available' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id`,
      });
      for (const r of rows) bareStarted[Number(r.id)] = now();
    });
  });
  await claimer.query('LISTEN bare_queue');
  await sleep(500);
  for (let i = 0; i < JOBS; i++) {
    t0[i] = now();
    await producer.query({ name: 'enqueue', text: `WITH i AS (INSERT INTO bare_queue (id) VALUES ($1) RETURNING id) SELECT pg_notify('bare_queue', id::text) FROM i`, values: [i] });
    bareEnqueued[i] = now();
    await sleep(Math.max(0, t0[i]! + 1000 / RATE - now()));
  }
  await sleep(500);
  await claiming;
  await Promise.all([producer.end(), claimer.end()]);
  show('bare: insert committed', bareEnqueued);
  show('bare: claim committed', bareStarted);
} finally {
  await mailroom.close();
  await dropDatabase(serverUrl, name);
}
