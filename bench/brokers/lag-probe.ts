/**
 * Where the end-to-end lag goes: events published one per transaction at RATE
 * for SECONDS through BROKER (or INTERNAL=1: the internal fan-out), then per
 * event, from the database's clock (each a transaction's start): outbox commit -> job stored
 * (relay, broker, ingest) -> job claimed -> job completed (worker). Prints percentiles of each.
 *
 *   npx tsx bench/brokers/lag-probe.ts   (env: BROKER=rabbitmq|nats|redis, INTERNAL=1, RATE, SECONDS, KEYS, PER_TX, RBATCH (the relay's batchSize; unset: its default), WPREFETCH (the group's worker prefetch, default 200), SOURCE_PREFETCH (the broker source's, default 500), SECONDLY=1 for each second's percentiles, MONITOR=1 for the relay's and the group's backlog each second, ROUNDS=1, KEEP=1)
 */
import pg from 'pg';
import { createMailroom } from '../../dist/index.js';
import { createDatabase, dropDatabase } from '../db.ts';
import { atMost } from '../stats.ts';
import { brokerUrls, noted, PAD, setups, type Kind } from './setups.ts';

const serverUrl = 'postgres://postgres@127.0.0.1:5432/postgres';
const kind = (process.env.BROKER ?? 'rabbitmq') as Kind;
const internal = process.env.INTERNAL === '1';
const rate = Number(process.env.RATE ?? 1000);
const seconds = Number(process.env.SECONDS ?? 5);
const keys = Number(process.env.KEYS ?? 10_000);
const perTx = Number(process.env.PER_TX ?? 1);
const name = `mrbench_probe_${Date.now().toString(36)}`;
const setup = setups(brokerUrls())[kind];
const url = await createDatabase(serverUrl, name);
const mailroom = await createMailroom({ database: url, poolSize: 12 });
await mailroom.migrate();
// Publishers with a pool of their own, as in bench:brokers: sharing the relay's and the consumer's pool starved them at high rates.
const producers = await createMailroom({ database: url, poolSize: 12 });
const total = Math.round(rate * seconds);
let handled = 0;
let resolveAll: () => void = () => {};
const all = new Promise<void>((r) => (resolveAll = r));
if (!internal) await setup.prepare(name);
const consumer = mailroom.consumer({
  group: 'bench',
  ...(internal ? {} : { source: setup.source(name) }),
  concurrency: 50,
  prefetch: Number(process.env.WPREFETCH ?? 200),
  pollInterval: 200,
  handlers: { [noted.type]: async () => { if (++handled >= total) resolveAll(); } },
});
consumer.on('warning', () => {});
await consumer.start();
// RBATCH unset: the relay's default batch size (growing during a backlog).
const batchSize = process.env.RBATCH === undefined ? undefined : Number(process.env.RBATCH);
const relay = mailroom.relay(internal ? { pollInterval: 50, batchSize } : { to: [setup.target(name)], internal: false, pollInterval: 50, batchSize });
relay.on('warning', () => {});
relay.on('held-back', () => {});
let rounds = 0;
const deliveries: { at: number; count: number }[] = [];
relay.on('delivered', (info: { count: number }) => { rounds++; deliveries.push({ at: performance.now(), count: info.count }); });
let held = 0;
relay.on('held-back', () => held++);
await relay.start();
// MONITOR=1: each second, the events the relay has not delivered and the group's unfinished jobs.
const monitor = process.env.MONITOR
  ? setInterval(() => {
      void mailroom.stats().then((st) => {
        const r = Object.values(st.relay)[0];
        console.log(`  [monitor] relay unpublished ${r?.unpublished}, group unfinished ${st.consumers.bench?.unfinished}, handled ${handled}`);
      });
    }, 1000)
  : undefined;
const started = performance.now();
const inFlight = new Set<Promise<unknown>>();
for (let sent = 0; sent < total; ) {
  const due = Math.min(total, Math.floor(((performance.now() - started) / 1000) * rate));
  while (sent + perTx <= due || (sent < due && due === total)) {
    const items = Array.from({ length: Math.min(perTx, total - sent) }, (_, i) => ({ n: sent + i, pad: PAD }));
    sent += items.length;
    const p = producers.publishMany(noted, items, keys > 0 ? { key: (d) => `order-${d.n % keys}` } : {});
    inFlight.add(p);
    void p.finally(() => inFlight.delete(p));
  }
  await new Promise((r) => setTimeout(r, 10));
}
await Promise.all(inFlight);
await producers.close();
await atMost(all, 60_000);
clearInterval(monitor);
await consumer.stop();
await relay.stop();
const c = new pg.Client(url);
await c.connect();
const { rows } = await c.query(`
  SELECT extract(epoch FROM j.created_at - o.created_at) * 1000 AS stored, extract(epoch FROM j.finished_at - j.created_at) * 1000 AS worked,
         extract(epoch FROM j.started_at - j.created_at) * 1000 AS claimed,
         extract(epoch FROM o.created_at - min(o.created_at) OVER ()) AS second
    FROM mailroom.outbox o JOIN mailroom.jobs j ON j.payload->>'id' = o.id::text WHERE j.queue = 'consumer.bench'`);
await c.end();
const pct = (xs: number[], p: number) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!.toFixed(1); };
const stored = rows.map((r) => Number(r.stored));
const worked = rows.filter((r) => r.worked !== null).map((r) => Number(r.worked));
const claimed = rows.filter((r) => r.worked !== null).map((r) => Number(r.claimed));
const ran = rows.filter((r) => r.worked !== null).map((r) => Number(r.worked) - Number(r.claimed));
console.log(`${internal ? 'internal' : kind} at ${rate}/s, ${keys} keys: ${rows.length} jobs, ${worked.length} completed, ${handled} handled, ${rounds} relay deliveries`);
console.log(`  commit -> stored as job: p50 ${pct(stored, 50)} p90 ${pct(stored, 90)} p99 ${pct(stored, 99)} ms`);
console.log(`  stored -> completed:     p50 ${pct(worked, 50)} p90 ${pct(worked, 90)} p99 ${pct(worked, 99)} ms`);
console.log(`    stored -> claimed (its last claim): p50 ${pct(claimed, 50)} p90 ${pct(claimed, 90)} p99 ${pct(claimed, 99)} ms`);
console.log(`    claimed -> completed:               p50 ${pct(ran, 50)} p90 ${pct(ran, 90)} p99 ${pct(ran, 99)} ms`);
if (process.env.SECONDLY) {
  for (let second = 0; second < Math.ceil(seconds); second++) {
    const these = rows.filter((r) => Math.floor(Number(r.second)) === second && r.worked !== null);
    if (these.length === 0) continue;
    const completedAfter = these.map((r) => Number(r.stored) + Number(r.worked));
    const storedAfter = these.map((r) => Number(r.stored));
    console.log(`  second ${second}: ${these.length} events, commit -> completed p50 ${pct(completedAfter, 50)} p99 ${pct(completedAfter, 99)} ms (stored p50 ${pct(storedAfter, 50)} p99 ${pct(storedAfter, 99)})`);
  }
}
if (process.env.ROUNDS) for (let i = 1; i < deliveries.length; i++) console.log(`  +${(deliveries[i]!.at - deliveries[i - 1]!.at).toFixed(1)} ms: ${deliveries[i]!.count}`);
console.log(`  held-back reports ${held}`);
if (!internal) await setup.cleanup(name).catch(() => {});
await mailroom.close({ timeout: 2000 });
if (process.env.KEEP) console.log(`kept ${url}`); else await dropDatabase(serverUrl, name);
