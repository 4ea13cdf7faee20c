/**
 * The reader of a `bench:brokers` lag run, in a process of its own: the service that takes the
 * relayed events from the broker, as it would be deployed. Forked by main.ts with the task in
 * LAG_READER_ENV. `group` reads through a consumer group (an event arrives when its handler
 * starts, stored as a job of the group first); `broker` reads through the group's source alone,
 * with no database (an event arrives when the broker delivers it, acknowledged at once).
 *
 * Answers `{ ready }` once reading, `{ all }` once `expected` events have arrived, and
 * `{ arrivals }` (each event's id and arrival time, `now()`) when told `'stop'`.
 */
import { createMailroom, type Mailroom } from '../../dist/index.js';
import { now } from '../stats.ts';
import { noted, setups, type Kind } from './setups.ts';

export const LAG_READER_ENV = 'MAILROOM_BENCH_LAG_READER';

/**
 * `group`: a consumer group, to its handler's start. `broker`: the group's source alone, no
 * database, to the message's arrival (another service reading the broker).
 */
export type LagReader = 'group' | 'broker';

/** What main.ts tells the reader. */
export interface LagReaderTask {
  reader: LagReader;
  kind: Kind;
  urls: Record<Kind, string>;
  /** The broker's destination (stream, exchange and queue) and the group's name. */
  name: string;
  /** The run's database: the group's jobs and inbox (unused by `broker`). */
  databaseUrl: string;
  expected: number;
}

/** Each event's id and the time it arrived, in arrival order (an event delivered twice is in twice). */
export interface Arrivals {
  ids: string[];
  at: number[];
}

interface Reading {
  stop(): Promise<void>;
}

function report(e: unknown): void {
  process.stderr.write(`  reader error: ${e instanceof Error ? e.message : String(e)}\n`);
}

async function readThroughGroup(task: LagReaderTask, arrived: (id: string) => void): Promise<Reading> {
  const mailroom: Mailroom = await createMailroom({ database: task.databaseUrl, poolSize: 12 });
  const consumer = mailroom.consumer({
    group: 'bench',
    source: setups(task.urls)[task.kind].source(task.name),
    concurrency: 50,
    prefetch: 200,
    pollInterval: 200,
    handlers: { [noted.type]: async (event) => arrived(event.id) },
  });
  consumer.on('warning', () => {});
  consumer.on('error', report);
  await consumer.start();
  return {
    async stop() {
      await consumer.stop();
      await mailroom.close({ timeout: 2000 });
    },
  };
}

async function readSourceAlone(task: LagReaderTask, arrived: (id: string) => void): Promise<Reading> {
  const source = setups(task.urls)[task.kind].source(task.name);
  const decoder = new TextDecoder();
  const context = { group: 'bench', handlerTimeoutMs: null, report, warn: () => {} };
  await source.start((message) => {
    const body = typeof message.body === 'string' ? message.body : decoder.decode(message.body);
    arrived((JSON.parse(body) as { id: string }).id);
    void message.ack();
  }, context);
  return { stop: () => source.stop() };
}

const task = JSON.parse(process.env[LAG_READER_ENV] ?? 'null') as LagReaderTask | null;
if (task !== null) {
  const arrivals: Arrivals = { ids: [], at: [] };
  const arrived = (id: string): void => {
    arrivals.ids.push(id);
    arrivals.at.push(now());
    if (arrivals.ids.length === task.expected) process.send!({ all: true });
  };
  const reading = await (task.reader === 'group' ? readThroughGroup : readSourceAlone)(task, arrived);
  process.on('message', (message) => {
    if (message !== 'stop') return;
    void reading.stop().then(
      () => process.send!({ arrivals }),
      (error: unknown) => process.send!({ error: error instanceof Error ? error.message : String(error) }),
    );
  });
  process.send!({ ready: true });
  process.on('disconnect', () => process.exit(0));
}
