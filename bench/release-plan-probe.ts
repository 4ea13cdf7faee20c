/**
 * Whether the per-key release's plans go stale: one session completes a few
 * ordered jobs while the tables are nearly empty (plpgsql plans the trigger's
 * statements then and keeps the plans), the table grows to GROW jobs, and the
 * same session completes 24 ordered jobs four times; a new session does it
 * once more. The times should be alike (a few ms); a stale plan makes the
 * first session's ten times slower (docs/BENCHMARKS.md, session 6).
 *
 *   npm run build && npx tsx bench/release-plan-probe.ts   (env: GROW, EXPLAIN=1 to log the plans with auto_explain, KEEP=1)
 */
import pg from 'pg';
import { createMailroom, defineJob } from '../dist/index.js';
import { createDatabase, dropDatabase } from './db.ts';
const server = 'postgres://postgres@127.0.0.1:5432/postgres';
const name = `mrbench_release_plan_${Date.now().toString(36)}`;
const url = await createDatabase(server, name);
const m = await createMailroom({ database: url });
await m.migrate();
const job = defineJob<{ n: number }>('probe.noop', { queue: 'q' });
let seq = 0;
const add = (n: number) => m.enqueueMany(job, Array.from({ length: n }, () => ({ n: seq++ })), { orderingKey: (d) => `k${d.n}` });
const c = new pg.Client(url); await c.connect();
const round = async (label: string, limit: number) => {
  const { rows } = await c.query(`UPDATE mailroom.jobs SET state='active', claim_count=claim_count+1, locked_until=now()+interval '1 hour', attempt=attempt+1 WHERE id IN (SELECT id FROM mailroom.jobs WHERE state='available' AND NOT blocked ORDER BY id LIMIT ${limit}) RETURNING id, claim_count`);
  const t = performance.now();
  await c.query({ name: 'complete', text: `UPDATE mailroom.jobs AS j SET state = 'completed', finished_at = now(), locked_until = NULL FROM unnest($1::uuid[], $2::int[]) AS c(id, claim) WHERE j.id = c.id AND j.claim_count = c.claim AND j.state = 'active' RETURNING j.id`, values: [rows.map((r) => r.id), rows.map((r) => r.claim_count)] });
  console.log(`${label}: completed ${rows.length} in ${(performance.now() - t).toFixed(2)} ms`);
};
await add(3);
for (let i = 0; i < 3; i++) await round('small table', 1);
await add(Number(process.env.GROW ?? 20000));
if (process.env.EXPLAIN) { await c.query(`LOAD 'auto_explain'`); await c.query(`SET auto_explain.log_min_duration = 0`); await c.query(`SET auto_explain.log_nested_statements = on`); await c.query(`SET auto_explain.log_analyze = on`); }
for (let i = 0; i < 4; i++) await round('grown table', 24);
const fresh = new pg.Client(url); await fresh.connect();
await c.end();
const c2 = fresh;
{ const { rows } = await c2.query(`UPDATE mailroom.jobs SET state='active', claim_count=claim_count+1, locked_until=now()+interval '1 hour', attempt=attempt+1 WHERE id IN (SELECT id FROM mailroom.jobs WHERE state='available' AND NOT blocked ORDER BY id LIMIT 24) RETURNING id, claim_count`);
  const t = performance.now();
  await c2.query({ text: `UPDATE mailroom.jobs AS j SET state = 'completed', finished_at = now(), locked_until = NULL FROM unnest($1::uuid[], $2::int[]) AS c(id, claim) WHERE j.id = c.id AND j.claim_count = c.claim AND j.state = 'active' RETURNING j.id`, values: [rows.map((r) => r.id), rows.map((r) => r.claim_count)] });
  console.log(`fresh session, grown table: completed ${rows.length} in ${(performance.now() - t).toFixed(2)} ms`); }
await c2.end(); await m.close();
if (!process.env.KEEP) await dropDatabase(server, name);
