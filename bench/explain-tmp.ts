import { createMailroom } from '../dist/index.js';
import { relayQueries } from '../dist/relay/relay-queries.js';
import { createDatabase, dropDatabase } from './db.ts';
import { noted, PAD } from './brokers/setups.ts';
import pg from 'pg';
const serverUrl = 'postgres://postgres@127.0.0.1:5432/postgres';
const name = `mrbench_explain_${Date.now().toString(36)}`;
const url = await createDatabase(serverUrl, name);
const mailroom = await createMailroom({ database: url, poolSize: 4 });
await mailroom.migrate();
for (let i = 0; i < 60000; i += 1000) await mailroom.publishMany(noted, Array.from({ length: 1000 }, (_, j) => ({ n: i + j, pad: PAD })), { key: (d) => `k${d.n % 100}` });
await mailroom.close();
const c = new pg.Client(url); await c.connect();
if (process.env.ANALYZE) await c.query('VACUUM ANALYZE mailroom.outbox');
const q = relayQueries('"mailroom"').candidates;
const { rows: pts } = await c.query('select xid::text, position::text from mailroom.outbox order by xid, position');
for (const mode of ['auto', 'force_custom_plan', 'force_generic_plan']) {
  await c.query(`set plan_cache_mode = ${mode}`);
  const times: number[] = [];
  for (let i = 0; i < 50; i++) { const p = pts[i * 1000]; const t = performance.now(); await c.query({ name: `cand_${mode}`, text: q.text, values: [p.xid, p.position, null, 1000] }); times.push(performance.now() - t); }
  console.log(mode, 'first5', times.slice(0, 5).map((x) => x.toFixed(1)).join(' '), 'rest median', times.slice(5).sort((a, b) => a - b)[22].toFixed(1));
}
await c.query(`set plan_cache_mode = ${process.env.MODE ?? 'force_generic_plan'}`);
await c.query({ name: 'g', text: 'PREPARE gp AS ' + q.text.replace(/\$(\d)/g, '\$$$1') });
const p = pts[30000];
const r = await c.query(`EXPLAIN (ANALYZE, BUFFERS) EXECUTE gp('${p.xid}', ${p.position}, NULL, 1000)`);
console.log(r.rows.map((x: any) => x['QUERY PLAN']).join('\n'));
await c.end();
await dropDatabase(serverUrl, name);
