/**
 * What the Redis target's dedup guard costs on the server: 60,000 messages of
 * the relay's size in pipelines of 1,000, three ways, twice: bare XADDs (the
 * ceiling's way), the target's script (a SET NX PX guard then XADD per event,
 * 100 events a call), and the same script's loop with XADD only.
 *
 *   npx tsx bench/brokers/redis-guard-probe.ts
 */
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { ADD_SCRIPT, dedupKey, eventArguments } from '../../dist/brokers/redis/add-script.js';
import { CLOUDEVENTS_CONTENT_TYPE } from '../../dist/brokers/wire.js';

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
const guarded = (await client.script('LOAD', ADD_SCRIPT)) as string;
const bare = (await client.script('LOAD', NO_GUARD)) as string;

async function timed(label: string, fill: (pipeline: ReturnType<Redis['pipeline']>, ids: string[]) => void): Promise<void> {
  const started = performance.now();
  for (let sent = 0; sent < N; sent += 1000) {
    const pipeline = client.pipeline();
    fill(pipeline, Array.from({ length: 1000 }, () => randomUUID()));
    const replies = await pipeline.exec();
    const failed = replies?.find(([e]) => e !== null);
    if (failed) throw failed[0];
  }
  console.log(`${label.padEnd(34)} ${Math.round(N / ((performance.now() - started) / 1000))} messages/s`);
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
  }
} finally {
  const keys = await client.keys(`*${stream}*`);
  for (let i = 0; i < keys.length; i += 1000) await client.del(...keys.slice(i, i + 1000));
  client.disconnect();
}
