/**
 * A consumer group on its own: N events (keyed, one key each, or NOKEY=1)
 * relayed to one internal group whose handler does nothing (TX=1: one
 * statement through ctx.tx, so each event is a transaction of its own with its
 * inbox key); events/s from the relay's start to the last handler. A handler
 * that never opens ctx.tx has its inbox key written with the batched completion.
 *
 *   npm run build && npx tsx bench/consumer-alone.ts   (env: N, CONC, PREFETCH, POOL, NOKEY, TX, RBATCH (the relay's batchSize, 1000; default: its default), ASYNC=1 for synchronous_commit off, LOG=1 to log statements)
 */
import { createMailroom, defineEvent } from '../dist/index.js';
import { createDatabase, dropDatabase } from './db.ts';
const serverUrl = 'postgres://postgres@127.0.0.1:5432/postgres';
const name = `mrbench_cons_${Date.now().toString(36)}`;
const url = await createDatabase(serverUrl, name);
if (process.env.LOG) { const pg = (await import('pg')).default; const c = new pg.Client(serverUrl); await c.connect(); await c.query(`ALTER DATABASE "${name}" SET log_min_duration_statement = 0`); await c.end(); }
if (process.env.ASYNC) { const pg = (await import('pg')).default; const c = new pg.Client(serverUrl); await c.connect(); await c.query(`ALTER DATABASE "${name}" SET synchronous_commit = off`); await c.end(); }
const m = await createMailroom({ database: url, poolSize: Number(process.env.POOL ?? 12) });
await m.migrate();
const ev = defineEvent<{ n: number }>('bench.item-noted', { version: 1 });
const N = Number(process.env.N ?? 5000);
let handled = 0; let done: () => void; const all = new Promise<void>((r) => (done = r));
const c = m.consumer({ group: 'g', concurrency: Number(process.env.CONC ?? 50), prefetch: Number(process.env.PREFETCH ?? 200), handlers: { [ev.type]: async (_e, ctx) => { if (process.env.TX) await ctx.tx.query('SELECT 1'); if (++handled >= N) done(); } } });
await c.start();
for (let i = 0; i < N; i += 1000) await m.publishMany(ev, Array.from({ length: 1000 }, (_, j) => ({ n: i + j })), process.env.NOKEY ? {} : { key: (d) => `order-${d.n}` });
const r = m.relay(process.env.RBATCH === 'default' ? {} : { batchSize: Number(process.env.RBATCH ?? 1000) }); await r.start();
const t0 = performance.now();
await all;
console.log(`consumer: ${N} in ${((performance.now() - t0) / 1000).toFixed(2)} s = ${Math.round(N / ((performance.now() - t0) / 1000))}/s`);
await r.stop(); await c.stop(); await m.close(); await dropDatabase(serverUrl, name);
