/**
 * What publishing costs, for comparing two builds: 40,000 keyed events (100
 * keys; NOKEY=1: without keys) in bulk calls of 1,000, then 4,000 one per
 * transaction from 8 callers at once, into a fresh database.
 *
 *   DIST=/abs/path/to/dist/index.js npx tsx bench/publish-alone.ts   (DIST defaults to this checkout's build)
 */
import pg from 'pg';

const dist = process.env.DIST ?? new URL('../dist/index.js', import.meta.url).href;
const { createMailroom, defineEvent } = (await import(dist)) as typeof import('../dist/index.js');
const noted = defineEvent<{ n: number; pad: string }>('bench.item-noted', { version: 1 });
const PAD = 'x'.repeat(120);
const admin = new pg.Client('postgres://postgres@127.0.0.1:5432/postgres');
await admin.connect();
const db = `probe_pub_${Date.now().toString(36)}`;
await admin.query(`CREATE DATABASE ${db}`);
const mailroom = await createMailroom({ database: `postgres://postgres@127.0.0.1:5432/${db}`, poolSize: 8 });
await mailroom.migrate();
let t = performance.now();
for (let i = 0; i < 40000; i += 1000) await mailroom.publishMany(noted, Array.from({ length: 1000 }, (_, j) => ({ n: i + j, pad: PAD })), process.env.NOKEY ? {} : { key: (d) => `k${d.n % 100}` });
const bulk = 40000 / ((performance.now() - t) / 1000);
t = performance.now();
let n = 0;
await Promise.all(Array.from({ length: 8 }, async () => { while (n < 4000) { const k = n++; await mailroom.publish(noted, { n: k, pad: PAD }, process.env.NOKEY ? {} : { key: `k${k % 100}` }); } }));
const single = 4000 / ((performance.now() - t) / 1000);
console.log(`bulk ${Math.round(bulk)}/s, single (8 at once) ${Math.round(single)}/s`);
await mailroom.close();
await admin.query(`DROP DATABASE ${db}`);
await admin.end();
