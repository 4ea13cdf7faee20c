/**
 * A mailroom process of the reliability suite (test/reliability.test.ts):
 *
 *   node --import tsx test/reliability/node-process.ts '<json NodeProcessConfig>'
 *
 * It runs the roles it is given on one schema:
 * - `jobs`: a worker on queue `rel` (job `rel.job`);
 * - `inproc`: consumer group `inproc` of the internal fan-out (event `rel.noted`);
 * - `relay`: the relay, internal fan-out plus the RabbitMQ target when `rabbit` is set;
 * - `rabbit`: consumer group `rabbit`, reading the RabbitMQ queue (one process reads it, for per-key order).
 *
 * Every handler records its run in `h_runs` on its own autocommit connection,
 * then its effect in `h_effects` through `ctx.tx` (test/reliability/history.ts),
 * then pauses, then throws on the first attempt of a job marked `failFirst`.
 * Every stdout line is one JSON object (`NodeProcessLine`, in definitions.ts); sessions carry
 * `application_name` `<appPrefix>-<pid>`.
 */
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { PgDriver } from '../../src/storage/pg-driver.ts';
import { openMailroom } from '../../src/mailroom.ts';
import { type ConsumedEvent, type ConsumerContext, type Job, type JobContext } from '../../src/index.ts';
import { rabbitmq, rabbitmqSource } from '../../src/brokers/rabbitmq/index.ts';
import { historyQueries } from './history-queries.ts';
import { INPROC_GROUP, RABBIT_GROUP, relEvent, relJob, type EventPayload, type JobPayload, type NodeProcessConfig, type NodeProcessLine, type NodeRole } from './definitions.ts';

function print(line: NodeProcessLine): void {
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

const main = async (config: NodeProcessConfig): Promise<void> => {
  const url = new URL(config.url);
  url.searchParams.set('application_name', `${config.appPrefix}-${process.pid}`);
  const h = historyQueries(`"${config.schema}"`);
  // The driver createMailroom would make, with the scenario's stall check.
  const poolSize = config.concurrency * config.roles.length + 6;
  const mailroom = await openMailroom(
    { schema: config.schema, poolSize, rescueInterval: config.rescueInterval },
    async () => new PgDriver(new pg.Pool({ connectionString: url.toString(), max: poolSize }), true, undefined, config.stallCheck),
  );
  mailroom.on('error', () => {}); // printed per role below
  // The run records go through a driver of their own: on a stalled connection they must not wait 15 minutes either.
  const records = new PgDriver(new pg.Pool({ connectionString: url.toString(), max: 2 }), true, undefined, config.stallCheck);
  const [minMs, maxMs] = config.sleepMs;
  const pause = () => new Promise<void>((resolve) => setTimeout(resolve, minMs + Math.floor(Math.random() * (maxMs - minMs + 1))));
  const onError = (role: NodeRole) => (error: unknown) => print({ event: 'error', role, message: error instanceof Error ? error.message : String(error) });

  /** The handler of every destination: run record, effect through ctx.tx, pause, maybe an injected failure. */
  const handle = async (dest: string, op: string, key: string | null, seq: number | null, jobId: string, attempt: number, failFirst: boolean, ctx: JobContext) => {
    const run = randomUUID();
    await records.run(h.recordRun, [run, dest, op, jobId, attempt, process.pid]);
    await ctx.tx.query(h.recordEffect.text, [run, dest, op, key, seq, jobId, attempt, process.pid]);
    await pause(); // the transaction stays open meanwhile
    if (failFirst && attempt === 1) throw new Error('injected failure after the effect: it must roll back and run again');
  };

  const starts: (() => Promise<void>)[] = [];
  const common = { concurrency: config.concurrency, lease: config.lease, pollInterval: config.pollInterval };
  if (config.roles.includes('jobs')) {
    const job = relJob(config.retry);
    const worker = mailroom.worker({
      ...common,
      queues: [job.queue],
      handlers: { [job.name]: (j: Job<JobPayload>, ctx: JobContext) => handle(j.queue, j.data.op, j.data.key, j.data.seq, j.id, j.attempt, j.data.failFirst, ctx) },
    });
    worker.on('stale', (j) => print({ event: 'stale', id: j.id, attempt: j.attempt }));
    worker.on('error', onError('jobs'));
    starts.push(() => worker.start());
  }
  const eventHandler = async (event: ConsumedEvent<EventPayload>, ctx: ConsumerContext) =>
    handle(ctx.group, event.data.op, event.data.key, event.data.seq, ctx.job.id, ctx.job.attempt, false, ctx);
  for (const [role, group] of [['inproc', INPROC_GROUP], ['rabbit', RABBIT_GROUP]] as const) {
    if (!config.roles.includes(role)) continue;
    if (role === 'rabbit' && !config.rabbit) throw new Error('the rabbit role needs config.rabbit');
    const consumer = mailroom.consumer({
      ...common,
      group,
      retry: config.retry,
      ...(role === 'rabbit' ? { source: rabbitmqSource({ url: config.rabbit!.url, queue: config.rabbit!.queue, prefetch: 50, declare: { exchange: config.rabbit!.exchange, type: 'quorum' } }) } : {}),
      handlers: { [relEvent.type]: eventHandler },
    });
    consumer.on('stale', (j) => print({ event: 'stale', id: j.id, attempt: j.attempt }));
    consumer.on('error', onError(role));
    consumer.on('warning', () => {});
    starts.push(() => consumer.start());
  }
  if (config.roles.includes('relay')) {
    const relay = mailroom.relay({
      to: config.rabbit ? [rabbitmq({ url: config.rabbit.url, exchange: config.rabbit.exchange, confirmTimeout: '5s' })] : [],
      lease: config.relayLease,
      batchSize: 50,
      pollInterval: 50,
    });
    relay.on('held-back', (info) => print({ event: 'held-back', waiting: info.waiting }));
    relay.on('delivered', (info) => print({ event: 'delivered', target: info.target, count: info.count }));
    relay.on('error', onError('relay'));
    relay.on('warning', () => {});
    starts.push(() => relay.start());
  }
  await Promise.all(starts.map((start) => start()));
  print({ event: 'ready', pid: process.pid });
};

const config = JSON.parse(process.argv[2] ?? 'null') as NodeProcessConfig | null;
if (config) await main(config);
