/**
 * One mailroom drain, alone, for profiling and A/B runs of two builds (not part of `npm run bench`).
 *
 *   npm run build && N=100000 P=1000 node bench/drain-alone.mjs
 *   DIST=/path/to/other/dist/index.js ...   another build (its sql/ must sit beside its dist/)
 *   KEYS=100                               spread the jobs over that many ordering keys
 *   PROGRESS=1                             print the time at each tenth
 *   PROF=1 / HEAP=1                        CPU profile / sampled allocations of the drain only (/tmp/prof, /tmp/heap.json)
 *   COUNT=1                                statements sent, by name
 *   CPU=1                                  CPU seconds of each process kind during the drain (run with node --import tsx)
 *   HISTORY=200000                         that many completed jobs beside the backlog, then ANALYZE: a queue that keeps its history
 *   DB=postgres://...                      server (default the test database); a schema of its own, dropped after
 *
 * Env: N jobs (20000), C concurrency (20), P prefetch (300).
 */
import pg from 'pg';
import { Session } from 'node:inspector/promises';
import fs from 'node:fs';
const session = new Session(); session.connect(); await session.post('Profiler.enable');
const { createMailroom, defineJob } = await import(process.env.DIST ?? '../dist/index.js');
const counts = new Map(); const rowsBy = new Map();
if (process.env.COUNT) { const orig = pg.Client.prototype.query; pg.Client.prototype.query = function (cfg, ...rest) { const k = typeof cfg === 'string' ? cfg.slice(0, 30) : (cfg?.name ?? String(cfg?.text).slice(0, 30)); counts.set(k, (counts.get(k) ?? 0) + 1); const r = orig.call(this, cfg, ...rest); if (r && r.then) r.then((res) => rowsBy.set(k, (rowsBy.get(k) ?? 0) + (res?.rowCount ?? 0)), () => {}); return r; }; }
const N = Number(process.env.N ?? 20000), C = Number(process.env.C ?? 20), P = Number(process.env.P ?? 300);
const schema = `scratch_${process.pid}`;
const url = process.env.DB ?? 'postgres://postgres@127.0.0.1:5432/test';
const job = defineJob('s.noop', { queue: 'bench' });
const m = await createMailroom({ database: url, schema });
await m.migrate();
for (let i = 0; i < N; i += 1000) await m.enqueueMany(job, Array.from({ length: Math.min(1000, N - i) }, (_, k) => ({ n: i + k })), process.env.KEYS ? { orderingKey: (d) => String(d.n % Number(process.env.KEYS)) } : {});
if (process.env.HISTORY) {
  const c = new pg.Client(url); await c.connect();
  await c.query(`INSERT INTO ${schema}.jobs (id, queue, type, state, max_attempts, payload, finished_at)
                 SELECT gen_random_uuid(), 'bench', 's.noop', 'completed', 5, '{}', now() FROM generate_series(1, $1::int)`, [Number(process.env.HISTORY)]);
  await c.query(`ANALYZE ${schema}.jobs`); await c.end();
}
let done = 0; let t0 = 0; let finish; const all = new Promise((r) => (finish = r));
const w = m.worker({ queues: ['bench'], concurrency: C, prefetch: P, handlers: { [job.name]: async () => { if (!t0) t0 = performance.now(); } } });
const cpu = process.env.CPU ? await import('./cpu-split.ts') : null;
const cpuBefore = cpu?.sampleCpu();
if (process.env.PROF) await session.post('Profiler.start');
if (process.env.HEAP) await session.post('HeapProfiler.startSampling', { samplingInterval: 4096, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true });
w.on('completed', () => { ++done; if (process.env.PROGRESS && done % Math.floor(N/10) === 0) console.log(`${done} at ${(performance.now() - t0).toFixed(0)} ms`); if (done === N) finish(); });
await w.start();
await all;
const ms = performance.now() - t0;
const cpuAfter = cpu?.sampleCpu();
if (process.env.PROF) { const { profile } = await session.post('Profiler.stop'); fs.rmSync('/tmp/prof', { recursive: true, force: true }); fs.mkdirSync('/tmp/prof'); fs.writeFileSync('/tmp/prof/p.cpuprofile', JSON.stringify(profile)); }
if (process.env.HEAP) { const { profile } = await session.post('HeapProfiler.stopSampling'); fs.writeFileSync('/tmp/heap.json', JSON.stringify(profile)); }
console.log(`drained ${N} in ${ms.toFixed(0)} ms: ${Math.round(N / ms * 1000)} jobs/s`);
if (cpu) console.log(`  CPU during the drain: ${cpu.formatCpuSplit(cpu.cpuSplit(cpuBefore, cpuAfter), ms / 1000)}`);
if (process.env.COUNT) for (const [k, v] of counts) if (v > 5) console.log(k, v, 'statements', rowsBy.get(k), 'rows');
await w.stop();
await m.close();
const c = new pg.Client(url); await c.connect(); await c.query(`DROP SCHEMA ${schema} CASCADE`); await c.end();
