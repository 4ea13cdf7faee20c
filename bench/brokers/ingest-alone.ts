/**
 * A consumer group taking a backlog from a broker: N keyed events relayed to
 * BROKER first (the group stopped), then the group started; events/s until
 * every message was stored as a job (ingested and acknowledged) and until
 * every handler ran, and the sizes of the stored batches.
 *
 *   npm run build && BROKER=rabbitmq|nats|redis SOURCE_PREFETCH=100 npx tsx bench/brokers/ingest-alone.ts   (env: N, KEYS)
 */
import { createMailroom, type Mailroom } from '../../dist/index.js';
import { createDatabase, dropDatabase } from '../db.ts';
import { brokerUrls, noted, PAD, setups, type Kind } from './setups.ts';

const kind = (process.env.BROKER ?? 'rabbitmq') as Kind;
const N = Number(process.env.N ?? 30000);
const KEYS = Number(process.env.KEYS ?? 10_000);
const serverUrl = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const name = `mrbench_ingest_${Date.now().toString(36)}`;
const setup = setups(brokerUrls())[kind];
if (!setup) throw new Error(`BROKER must be rabbitmq, nats or redis, got ${kind}`);

let handled = 0;
let stored = 0;
let storedAt = 0;
let handledAt = 0;
const sizes: number[] = [];
const group = (m: Mailroom) => {
  const consumer = m.consumer({
    group: 'bench',
    source: setup.source(name),
    concurrency: 50,
    prefetch: 200,
    handlers: { [noted.type]: async () => void (++handled === N && (handledAt = performance.now())) },
  });
  consumer.on('ingested', (info) => {
    sizes.push(info.messages);
    if ((stored += info.messages) >= N && storedAt === 0) storedAt = performance.now();
  });
  consumer.on('warning', () => {});
  return consumer;
};

const url = await createDatabase(serverUrl, name);
const mailroom = await createMailroom({ database: url, poolSize: 12 });
try {
  await mailroom.migrate();
  await setup.prepare(name);
  // Started and stopped once, so that its queue, durable consumer or stream group exists before the events are.
  const first = group(mailroom);
  await first.start();
  await first.stop();
  for (let i = 0; i < N; i += 1000) {
    await mailroom.publishMany(noted, Array.from({ length: Math.min(1000, N - i) }, (_, j) => ({ n: i + j, pad: PAD })), { key: (d) => `order-${d.n % KEYS}` });
  }
  const relay = mailroom.relay({ to: [setup.target(name)], internal: false, pollInterval: 50 });
  relay.on('warning', () => {});
  await relay.flush();
  await relay.stop();
  const consumer = group(mailroom);
  const started = performance.now();
  await consumer.start();
  while (handledAt === 0 && performance.now() - started < 120_000) await new Promise((r) => setTimeout(r, 20));
  await consumer.stop();
  if (handledAt === 0) throw new Error(`only ${handled} of ${N} handled in 120 s`);
  const rate = (at: number) => `${((at - started) / 1000).toFixed(2)} s = ${Math.round(N / ((at - started) / 1000))}/s`;
  const ones = sizes.filter((n) => n === 1).length;
  console.log(`${kind}, source prefetch ${process.env.SOURCE_PREFETCH ?? 500}: ${N} stored in ${rate(storedAt)}; handled in ${rate(handledAt)}`);
  console.log(`  ${sizes.length} batches stored, ${(N / sizes.length).toFixed(1)} messages on average, ${ones} of one message`);
} finally {
  await mailroom.close();
  await setup.cleanup(name).catch(() => undefined);
  await dropDatabase(serverUrl, name);
}
