/**
 * A process whose PostgreSQL sessions the reliability suite terminates over
 * and over (test/reliability.test.ts, "pg_terminate_backend in the instant a
 * session connects"):
 *
 *   node --import tsx test/reliability/terminate-victim.ts <postgres url> <schema>
 *
 * Four loops of `mailroom.transaction` and a worker (whose LISTEN session
 * reconnects) keep opening sessions; it prints `{"transactions":n}` every
 * 200 ms. A terminated session must fail a transaction, never the process.
 */
import { createMailroom, defineJob } from '../../src/index.ts';

const [url, schema] = process.argv.slice(2);
const mailroom = await createMailroom({ database: url, schema, poolSize: 6 });
await mailroom.migrate();
mailroom.on('error', () => {});
const idle = defineJob('victim.idle', { queue: 'victim' });
const worker = mailroom.worker({ queues: [idle.queue], pollInterval: 50, handlers: { [idle.name]: () => {} } });
worker.on('error', () => {});
await worker.start();
let transactions = 0;
const loop = async () => {
  for (;;) {
    await mailroom.transaction((tx) => tx.query('SELECT 1')).then(
      () => transactions++,
      () => new Promise((resolve) => setTimeout(resolve, 5)),
    );
  }
};
for (let i = 0; i < 4; i++) void loop();
setInterval(() => process.stdout.write(`${JSON.stringify({ transactions })}\n`), 200);
