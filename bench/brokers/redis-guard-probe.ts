/**
 * What the Redis target's dedup guard costs on the server: 60,000 messages of
 * the relay's size in pipelines of 1,000, four ways, twice: bare XADDs (the
 * ceiling's way), the target's script (a SET NX PX guard then XADD per event,
 * 100 events a call), the same script's loop with XADD only, and a script that
 * compares each event's mark with one stored mark instead of a key per event
 * (the cost of a guard without a key per event; not a guard the target could
 * use as it is, see docs/BENCHMARKS.md, session 15). Prints each way's rate
 * and the CPU that Node and redis-server spent per message.
 *
 *   npx tsx bench/brokers/redis-guard-probe.ts
 */
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { ADD_SCRIPT, dedupKey, eventArguments } from '../../dist/brokers/redis/add-script.js';
import { CLOUDEVENTS_CONTENT_TYPE, TRANSPORT_HEADERS } from '../../dist/brokers/wire.js';
import { cpuSplit, sampleCpu } from '../cpu-split.ts';

const N = 60_000;
const PER_CALL = 100;
const client = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const stream = `guard-probe-${process.pid}`;
const body = 'x'.repeat(430);
const fieldsOf = (id: string) => ['id', id, 'type', 'bench.item-noted', 'key', 'k42', 'content-type', 'application/cloudevents+json; charset=utf-8', 'partitionkey', 'k42', 'body', body];
const NO_GUARD = `local a = 4
for k = 2, #KEYS do
  local n = tonumber(ARGV[a])
  redis.call('XADD', KEYS[1], '*', unpack(ARGV, a + 1, a + n))
  a = a + n + 1
end
return #KEYS - 1`;
/** ADD_SCRIPT's loop with one mark per event (ARGV[a]) compared with one stored mark (KEYS[2]) instead of a SET NX PX. */
const MARKED = `local last = redis.call('GET', KEYS[2]) or ''
local contentType = ARGV[4]
local headers = {${TRANSPORT_HEADERS.map((name) => `'${name}'`).join(', ')}}
local a, added = 5, 0
while a <= #ARGV do
  local mark, shape = ARGV[a], tonumber(ARGV[a + 1])
  local fields = {'id', ARGV[a + 2], 'type', ARGV[a + 3]}
  local n, v = 4, a + 4
  if bit.band(shape, 1) ~= 0 then
    fields[5], fields[6] = 'key', ARGV[v]
    n, v = 6, v + 1
  end
  fields[n + 1], fields[n + 2] = 'content-type', contentType
  n = n + 2
  for h = 1, 4 do
    if bit.band(shape, 2 ^ h) ~= 0 then
      fields[n + 1], fields[n + 2] = headers[h], ARGV[v]
      n, v = n + 2, v + 1
    end
  end
  fields[n + 1], fields[n + 2] = 'body', ARGV[v]
  if mark > last then
    redis.call('XADD', KEYS[1], '*', unpack(fields))
    last = mark
    added = added + 1
  end
  a = v + 1
end
redis.call('SET', KEYS[2], last)
return added`;
const guarded = (await client.script('LOAD', ADD_SCRIPT)) as string;
const bare = (await client.script('LOAD', NO_GUARD)) as string;
const marked = (await client.script('LOAD', MARKED)) as string;
let mark = 0;

async function timed(label: string, fill: (pipeline: ReturnType<Redis['pipeline']>, ids: string[]) => void): Promise<void> {
  const cpuBefore = sampleCpu();
  const started = performance.now();
  for (let sent = 0; sent < N; sent += 1000) {
    const pipeline = client.pipeline();
    fill(pipeline, Array.from({ length: 1000 }, () => randomUUID()));
    const replies = await pipeline.exec();
    const failed = replies?.find(([e]) => e !== null);
    if (failed) throw failed[0];
  }
  const seconds = (performance.now() - started) / 1000;
  const cpu = cpuSplit(cpuBefore, sampleCpu());
  const perMessage = (name: string) => (((cpu[name] ?? 0) / N) * 1e6).toFixed(1);
  console.log(`${label.padEnd(34)} ${String(Math.round(N / seconds)).padStart(6)} messages/s; CPU per message: node ${perMessage('node')} µs, redis-server ${perMessage('redis-server')} µs`);
}
/** The guarded script takes values only (its own shape of arguments); the unguarded loop takes name/value pairs. */
const guardedArgs = (run: string[]) => {
  const args: (string | number)[] = ['0', 120_000, '', CLOUDEVENTS_CONTENT_TYPE];
  for (const id of run) eventArguments(args, { id, type: 'bench.item-noted', key: 'k42', contentType: CLOUDEVENTS_CONTENT_TYPE, headers: { partitionkey: 'k42' }, body });
  return args;
};
const pairArgs = (run: string[]) => {
  const args: (string | number)[] = ['0', 120_000, ''];
  for (const id of run) {
    const fields = fieldsOf(id);
    args.push(fields.length, ...fields);
  }
  return args;
};
const scripted = (sha: string, argsOf: (run: string[]) => (string | number)[]) => (pipeline: ReturnType<Redis['pipeline']>, ids: string[]) => {
  for (let start = 0; start < ids.length; start += PER_CALL) {
    const run = ids.slice(start, start + PER_CALL);
    pipeline.call('EVALSHA', [sha, run.length + 1, stream, ...run.map((id) => dedupKey(stream, id)), ...argsOf(run)]);
  }
};
try {
  for (let round = 0; round < 2; round++) {
    await timed('bare XADD', (pipeline, ids) => ids.forEach((id) => pipeline.xadd(stream, '*', ...fieldsOf(id))));
    await timed('script: SET NX PX guard + XADD', scripted(guarded, guardedArgs));
    await timed('script: XADD only', scripted(bare, pairArgs));
    await timed('script: one stored mark, XADD', (pipeline, ids) => {
      for (let start = 0; start < ids.length; start += PER_CALL) {
        const args: (string | number)[] = ['0', 120_000, '', CLOUDEVENTS_CONTENT_TYPE];
        for (const id of ids.slice(start, start + PER_CALL)) {
          args.push(String(++mark).padStart(20, '0'));
          eventArguments(args, { id, type: 'bench.item-noted', key: 'k42', contentType: CLOUDEVENTS_CONTENT_TYPE, headers: { partitionkey: 'k42' }, body });
        }
        pipeline.call('EVALSHA', [marked, 2, stream, `{${stream}}:mark`, ...args]);
      }
    });
  }
} finally {
  const keys = await client.keys(`*${stream}*`);
  for (let i = 0; i < keys.length; i += 1000) await client.del(...keys.slice(i, i + 1000));
  client.disconnect();
}
