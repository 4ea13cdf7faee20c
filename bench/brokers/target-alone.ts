/**
 * A broker target without the relay or a database: the adapter's own
 * publish of N events of the relay's size, in batches of BATCH, one batch at
 * a time. What the relay can reach at best with this adapter (its share of
 * the broker's ceiling is then the relay's read and the overlap).
 *
 *   N=40000 BATCH=1000 TARGET=redis|nats|rabbitmq npx tsx bench/brokers/target-alone.ts
 */
import { randomUUID } from 'node:crypto';
import { toEnvelope, type RelayedEvent } from '../../dist/index.js';
import { now } from '../stats.ts';
import { cpuSplit, formatCpuSplit, sampleCpu } from '../cpu-split.ts';
import { brokerUrls, noted, PAD, setups, type Kind } from './setups.ts';

const N = Number(process.env.N ?? 40000);
const BATCH = Number(process.env.BATCH ?? 1000);
const kind = (process.env.TARGET ?? 'redis') as Kind;
const brokers = setups(brokerUrls());
const broker = brokers[kind];
if (!broker) throw new Error(`TARGET must be rabbitmq, nats or redis, got ${kind}`);
const name = `mrbench_target_${Date.now().toString(36)}`;
await broker.prepare(name);
const target = broker.target(name);
/** Batch `i`, made when it is published (so the heap holds one batch, as the relay's does); not timed. */
function batchAt(i: number): RelayedEvent[] {
  return Array.from({ length: Math.min(BATCH, N - i) }, (_, j) => {
    const n = i + j;
    const envelope = toEnvelope({
      position: String(n + 1), xid: '1', id: randomUUID(), type: noted.type, version: 1, source: 'mailroom://bench-host',
      subject: `k${n % 100}`, time: new Date(), correlation_id: null, causation_id: null, traceparent: null, headers: null, data: { n, pad: PAD },
    });
    return Object.freeze({ position: String(n + 1), xid: '1', envelope });
  });
}
const context = { tx: { query: () => Promise.reject(new Error('a broker target has no transaction')) } };
try {
  await target.publish(batchAt(0).slice(0, 1), context); // connects (and declares what the target declares)
  let seconds = 0;
  const cpuBefore = sampleCpu();
  const wallStarted = now();
  for (let i = 0; i < N; i += BATCH) {
    const batch = batchAt(i);
    const started = now();
    await target.publish(batch, context);
    seconds += (now() - started) / 1000;
  }
  const cpuAfter = sampleCpu();
  console.log(`${kind} target alone: ${N} events in ${seconds.toFixed(2)} s = ${Math.round(N / seconds)} events/s (batch ${BATCH})`);
  console.log(`  CPU during the run (batches made too): ${formatCpuSplit(cpuSplit(cpuBefore, cpuAfter), (now() - wallStarted) / 1000)}`);
} finally {
  await target.close?.();
  await broker.cleanup(name).catch(() => undefined);
}
