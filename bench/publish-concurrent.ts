/**
 * Concurrent publishers (or enqueuers), one event (job) per transaction, for
 * SECONDS, with a relay delivering to a target that does nothing (or a worker
 * of concurrency 20 running no-op jobs; RELAY=0 / WORKER=0: none): events/s,
 * and how many NOTIFYs a listener on the channel received. For comparing two
 * builds (the NOTIFY serialises commits).
 *
 *   DIST=/abs/path/to/dist/index.js npx tsx bench/publish-concurrent.ts
 *   env: CALLERS (20), SECONDS (5), WHAT=event|job, RELAY=1|0, WORKER=1|0
 */
import pg from 'pg';

const dist = process.env.DIST ?? new URL('../dist/index.js', import.meta.url).href;
const { createMailroom, defineEvent, defineJob } = (await import(dist)) as typeof import('../dist/index.js');
const callers = Number(process.env.CALLERS ?? 20);
const seconds = Number(process.env.SECONDS ?? 5);
const what = process.env.WHAT === 'job' ? 'job' : 'event';
const withRelay = process.env.RELAY !== '0' && what === 'event';
const withWorker = process.env.WORKER !== '0' && what === 'job';
const serverUrl = 'postgres://postgres@127.0.0.1:5432/postgres';
const db = `probe_pubc_${Date.now().toString(36)}`;
const admin = new pg.Client(serverUrl);
await admin.connect();
await admin.query(`CREATE DATABASE ${db}`);
const url = `postgres://postgres@127.0.0.1:5432/${db}`;
const mailroom = await createMailroom({ database: url, poolSize: callers + 4 });
try {
  await mailroom.migrate();
  const noted = defineEvent<{ n: number }>('bench.item-noted', { version: 1 });
  const job = defineJob<{ n: number }>('bench.noop', { queue: 'bench' });
  let delivered = 0;
  const relay = withRelay ? mailroom.relay({ internal: false, to: [{ name: 'null', publish: async () => {} }] }) : null;
  relay?.on('delivered', (info) => (delivered += info.count));
  relay?.on('held-back', () => {});
  await relay?.start();
  let ran = 0;
  const worker = withWorker ? mailroom.worker({ queues: ['bench'], concurrency: 20, handlers: { [job.name]: () => void ran++ } }) : null;
  await worker?.start();
  await new Promise((r) => setTimeout(r, 300)); // the relay finds nothing and goes to sleep
  const listener = new pg.Client(url);
  await listener.connect();
  let notifications = 0;
  listener.on('notification', () => notifications++);
  await listener.query(`LISTEN ${what === 'job' ? 'mailroom_wakeup' : 'mailroom_outbox'}`);
  let n = 0;
  const started = performance.now();
  const end = Date.now() + seconds * 1000;
  await Promise.all(
    Array.from({ length: callers }, async () => {
      while (Date.now() < end) {
        if (what === 'job') await mailroom.enqueue(job, { n: n++ });
        else await mailroom.publish(noted, { n: n++ }, { key: `k${n % 1000}` });
      }
    }),
  );
  const elapsed = (performance.now() - started) / 1000;
  if (relay) {
    const deadline = Date.now() + 30_000;
    while (delivered < n && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    await relay.stop();
  }
  if (worker) {
    const deadline = Date.now() + 30_000;
    while (ran < n && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    await worker.stop();
  }
  await listener.end();
  const relayed = relay ? `; the relay delivered ${delivered}` : worker ? `; the worker ran ${ran}` : '';
  console.log(`${what}s: ${Math.round(n / elapsed)}/s from ${callers} callers (${n} transactions), ${notifications} NOTIFYs received${relayed}`);
} finally {
  await mailroom.close();
  await admin.query(`DROP DATABASE ${db}`);
  await admin.end();
}
