/**
 * The relay without a broker: N events in the outbox, one relay whose only
 * target does nothing (or the broker named by TARGET), events/s. For
 * profiling the relay's own share (`--cpu-prof`).
 *
 *   N=20000 TARGET=null|redis|nats|rabbitmq npx tsx bench/brokers/relay-alone.ts
 *   PROF=1 ...   a CPU profile of the relay's run only, in /tmp/prof
 *   HEAP=1 ...   sampled allocations of the relay's run only, in /tmp/prof/relay-<time>.heapprofile
 */
import { createMailroom, type RelayTarget } from '../../dist/index.js';
import { createDatabase, dropDatabase } from '../db.ts';
import { now } from '../stats.ts';
import { cpuSplit, formatCpuSplit, sampleCpu } from '../cpu-split.ts';
import { brokerUrls, checkHeld, noted, PAD, setups, type Kind } from './setups.ts';

const N = Number(process.env.N ?? 20000);
/** BATCH=default: the relay's default batch size (growing during a backlog). */
const BATCH = process.env.BATCH === 'default' ? undefined : Number(process.env.BATCH ?? 1000);
const kind = process.env.TARGET ?? 'null';
const serverUrl = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const name = `mrbench_relay_${Date.now().toString(36)}`;
const brokers = setups(brokerUrls());
const broker = kind === 'null' ? null : brokers[kind as Kind];
if (kind !== 'null' && !broker) throw new Error(`TARGET must be null, rabbitmq, nats or redis, got ${kind}`);
const target: RelayTarget = broker ? broker.target(name) : { name: 'null', publish: async () => {} };

const url = await createDatabase(serverUrl, name);
if (process.env.LOG_STATEMENTS) {
  const pg = (await import('pg')).default;
  const c = new pg.Client(serverUrl);
  await c.connect();
  await c.query(`ALTER DATABASE "${name}" SET log_min_duration_statement = 0`);
  await c.end();
}
/**
 * Starts the inspector's CPU profiler, or with `heap` its sampling heap profiler (every object
 * allocated, collected or not); the returned function writes /tmp/prof/relay-<time>.cpuprofile or .heapprofile.
 */
async function startProfile(heap: boolean): Promise<() => Promise<void>> {
  const { Session } = await import('node:inspector/promises');
  const { mkdir, writeFile } = await import('node:fs/promises');
  const session = new Session();
  session.connect();
  if (heap) {
    await session.post('HeapProfiler.startSampling', { samplingInterval: 4096, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true });
  } else {
    await session.post('Profiler.enable');
    await session.post('Profiler.start');
  }
  return async () => {
    const { profile } = heap ? await session.post('HeapProfiler.stopSampling') : await session.post('Profiler.stop');
    await mkdir('/tmp/prof', { recursive: true });
    await writeFile(`/tmp/prof/relay-${Date.now()}.${heap ? 'heapprofile' : 'cpuprofile'}`, JSON.stringify(profile));
    session.disconnect();
  };
}

const mailroom = await createMailroom({ database: url, poolSize: 4 });
try {
  await mailroom.migrate();
  for (let i = 0; i < N; i += 1000) {
    await mailroom.publishMany(noted, Array.from({ length: Math.min(1000, N - i) }, (_, j) => ({ n: i + j, pad: PAD })), { key: (d) => `k${d.n % 100}` });
  }
  await broker?.prepare(name);
  const relay = mailroom.relay({ to: [target], internal: false, batchSize: BATCH, pollInterval: 50 });
  relay.on('warning', () => {});
  let delivered = 0;
  const done = new Promise<void>((resolve) => relay.on('delivered', (i) => (delivered += i.count) >= N && resolve()));
  const profiler = process.env.PROF || process.env.HEAP ? await startProfile(Boolean(process.env.HEAP)) : null;
  const cpuBefore = sampleCpu();
  const started = now();
  await relay.start();
  await done;
  const seconds = (now() - started) / 1000;
  const cpuAfter = sampleCpu();
  await profiler?.();
  await relay.stop();
  if (broker) await checkHeld(broker, name, N);
  console.log(`${kind}: ${N} events in ${seconds.toFixed(2)} s = ${Math.round(N / seconds)} events/s (batch ${BATCH ?? 'default'})`);
  console.log(`  CPU during the run: ${formatCpuSplit(cpuSplit(cpuBefore, cpuAfter), seconds)}`);
} finally {
  await mailroom.close();
  await dropDatabase(serverUrl, name);
  await broker?.cleanup(name).catch(() => undefined);
}
