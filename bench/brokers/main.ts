/**
 * `npm run bench:brokers`: the relay from the outbox to each broker, beside
 * the broker's own ceiling measured in the same run.
 *
 * Per broker, in a fresh Node process of its own, in this order:
 * 1. ceiling: a bare client publishing N messages with confirms, batches of 100, no database;
 * 2. relay: N events already in the outbox (one fresh database), one relay with only that
 *    broker's target (batchSize 1000): events/s from start to the last confirmed batch, and from
 *    the first confirmed batch to the last (the relay's connections, script load and checks left
 *    out, as the ceiling's connection and stream are); then the ceiling again. Steps 1-2 make a
 *    round, repeated --rounds times (default 3; each round's first ceiling is the round before's
 *    last). A round's share is its relay against the higher of the ceilings on either side of it
 *    (on a shared machine a slow minute during one measurement would otherwise flatter the relay);
 *    the round with the median share is reported;
 * 3. lag: events published at a fixed rate for a few seconds (default 500/s and 1,000/s; 'half'
 *    is half the relay's own rate) by producers in a process of their own (lag-producer.ts), in at
 *    most PRODUCER_TX_PER_SECOND transactions a second (one event each up to that rate, then
 *    several), relayed by a relay in this process (default batch size) and read from the broker in
 *    a third process (lag-reader.ts); the time from each publish's commit to its reading, p50 / p99
 *    (the processes share `now()`'s clock). Each rate is measured with each of --lag-readers (default both):
 *    `group`, a consumer group (the message stored as a job, its handler's start: what a mailroom
 *    application sees), and `broker`, the group's source with no database behind it (the message's
 *    arrival: what another service reading the broker sees, the relay's own share of the lag).
 *    Everything (producers, relay, broker, reader, PostgreSQL) shares the machine. The first --lag-warmup seconds (default 2) run at
 *    the same rate and are not in the percentiles: a fresh process opens its connections,
 *    prepares its statements and compiles its hot code then (their p99 is reported apart).
 *
 * --autovacuum turns the server's autovacuum on for the run when it is off (PostgreSQL's default):
 * without it a fresh database is never analyzed, and plans made while its tables were empty stay.
 *
 *   npm run bench:brokers -- [--messages 100000] [--rounds 3] [--lag-seconds 5] [--lag-warmup 2] [--lag-rates 500,1000] [--lag-readers group,broker] [--only rabbitmq,nats,redis] [--json FILE] [--autovacuum]
 */
import { writeFile } from 'node:fs/promises';
import { createMailroom, type Mailroom } from '../../dist/index.js';
import { createDatabase, dropDatabase, enableAutovacuum } from '../db.ts';
import { atMost, now, percentile } from '../stats.ts';
import { brokerUrls, checkHeld, noted, PAD, setups, type BrokerSetup, type Kind } from './setups.ts';
import { forkTs, nextMessage } from '../spawn.ts';
import { LAG_PRODUCER_ENV, type Committed, type LagProducerTask } from './lag-producer.ts';
import { LAG_READER_ENV, type Arrivals, type LagReader, type LagReaderTask } from './lag-reader.ts';

interface Config {
  messages: number;
  lagSeconds: number;
  /** Seconds published at each lag rate before the measured ones (not in the percentiles). */
  lagWarmupSeconds: number;
  /** Rates for the lag runs; 'half' is half the relay's measured rate. */
  lagRates: (number | 'half')[];
  /** Who reads the relayed events in the lag runs (each rate is run with each). */
  lagReaders: LagReader[];
  only: Kind[];
  /** Relay runs, each between two ceiling runs; the one with the median share is reported. */
  rounds: number;
  json: string | null;
  /** Turn the server's autovacuum on for the run when it is off (PostgreSQL's default is on). */
  autovacuum: boolean;
  serverUrl: string;
  urls: Record<Kind, string>;
}

const LAG_READERS: readonly LagReader[] = ['group', 'broker'];

interface LagResult {
  reader: LagReader;
  ratePerSecond: number;
  events: number;
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
  /** The warm-up's events (not in the percentiles above) and their p99. */
  warmupEvents: number;
  warmupP99Ms: number;
}

/** One relay run and the ceilings measured on either side of it. */
interface RelayRound {
  ceilingBeforePerSecond: number;
  ceilingAfterPerSecond: number;
  relayPerSecond: number;
  relayAfterFirstBatchPerSecond: number;
  /** The relay against the higher of the two ceilings. */
  relayOfCeiling: number;
}

interface BrokerResult {
  kind: Kind;
  /** The higher of the two ceilings around the reported round (the one with the median share). */
  ceilingPerSecond: number;
  /** Every ceiling run, in order: one before the first relay run and one after each. */
  ceilingRunsPerSecond: number[];
  relayPerSecond: number;
  relayOfCeiling: number;
  /** From the first confirmed batch on (see {@link RelayThroughput}). */
  relayAfterFirstBatchPerSecond: number;
  relayAfterFirstBatchOfCeiling: number;
  rounds: RelayRound[];
  lag: LagResult[];
}

function parseArgs(argv: string[]): Config {
  const c: Config = {
    messages: 100_000,
    lagSeconds: 5,
    lagWarmupSeconds: 2,
    lagRates: [500, 1000],
    lagReaders: [...LAG_READERS],
    only: ['rabbitmq', 'nats', 'redis'],
    rounds: 3,
    json: null,
    autovacuum: false,
    serverUrl: process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres',
    urls: brokerUrls(),
  };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i]!;
    const value = () => {
      const v = argv[++i];
      if (v === undefined) throw new Error(`${flag} needs a value`);
      return v;
    };
    if (flag === '--messages') c.messages = Number(value());
    else if (flag === '--lag-seconds') c.lagSeconds = Number(value());
    else if (flag === '--lag-warmup') c.lagWarmupSeconds = Number(value());
    else if (flag === '--lag-rates') c.lagRates = value().split(',').map((r) => (r === 'half' ? 'half' : Number(r)));
    else if (flag === '--lag-readers') c.lagReaders = value().split(',') as LagReader[];
    else if (flag === '--only') c.only = value().split(',') as Kind[];
    else if (flag === '--rounds') c.rounds = Number(value());
    else if (flag === '--json') c.json = value();
    else if (flag === '--autovacuum') c.autovacuum = true;
    else if (flag === '--help') {
      console.log('npm run bench:brokers -- [--messages N] [--rounds 3] [--lag-seconds S] [--lag-warmup S] [--lag-rates 500,1000] [--lag-readers group,broker] [--only rabbitmq,nats,redis] [--json FILE] [--autovacuum]');
      process.exit(0);
    } else throw new Error(`unknown flag ${flag}; see --help`);
  }
  if (!Number.isInteger(c.messages) || c.messages < 100) throw new Error('--messages must be an integer of at least 100');
  if (!Number.isInteger(c.rounds) || c.rounds < 1) throw new Error('--rounds must be an integer of at least 1');
  if (!(c.lagSeconds > 0)) throw new Error('--lag-seconds must be a positive number');
  if (!(c.lagWarmupSeconds >= 0)) throw new Error('--lag-warmup must be a number of seconds, 0 or more');
  for (const r of c.lagReaders) if (!LAG_READERS.includes(r)) throw new Error(`--lag-readers: ${r} is not one of ${LAG_READERS.join(', ')}`);
  for (const r of c.lagRates) if (r !== 'half' && !(Number.isInteger(r) && r > 0)) throw new Error(`--lag-rates: ${r} is not a positive integer or 'half'`);
  for (const k of c.only) if (!['rabbitmq', 'nats', 'redis'].includes(k)) throw new Error(`--only: unknown broker ${k}`);
  return c;
}

async function withMailroom<T>(serverUrl: string, database: string, fn: (m: Mailroom, url: string) => Promise<T>): Promise<T> {
  const url = await createDatabase(serverUrl, database);
  const mailroom = await createMailroom({ database: url, poolSize: 12 });
  try {
    await mailroom.migrate();
    return await fn(mailroom, url);
  } finally {
    await mailroom.close({ timeout: 2000 }).catch(() => {});
    await dropDatabase(serverUrl, database);
  }
}

/** What the relay step measured. */
interface RelayThroughput {
  /** Events/s from the relay's start to the last confirmed batch (its connections, script load and checks included). */
  fromStart: number;
  /** Events/s from the first confirmed batch to the last: the rate once started, as the ceiling is timed. */
  afterFirstBatch: number;
}

/** N events in the outbox, then one relay to the broker: events/s until the last confirmed batch. */
async function relayThroughput(setup: BrokerSetup, serverUrl: string, name: string, messages: number): Promise<RelayThroughput> {
  return withMailroom(serverUrl, name, async (mailroom) => {
    for (let i = 0; i < messages; i += 1000) {
      const items = Array.from({ length: Math.min(1000, messages - i) }, (_, j) => ({ n: i + j, pad: PAD }));
      await mailroom.publishMany(noted, items, { key: (item) => `k${item.n % 100}` });
    }
    await setup.prepare(name);
    const target = setup.target(name);
    const relay = mailroom.relay({ to: [target], internal: false, batchSize: 1000, pollInterval: 50 });
    let delivered = 0;
    let first: { at: number; count: number } | null = null;
    const done = new Promise<void>((resolve) =>
      relay.on('delivered', (info) => {
        delivered += info.count;
        first ??= { at: now(), count: info.count };
        if (delivered >= messages) resolve();
      }),
    );
    relay.on('warning', () => {});
    relay.on('error', (e) => process.stderr.write(`  relay error: ${e instanceof Error ? e.message : String(e)}\n`));
    const started = now();
    await relay.start();
    await done;
    const ended = now();
    await relay.stop();
    await checkHeld(setup, name, messages);
    const { at, count } = first ?? { at: started, count: 0 };
    return { fromStart: messages / ((ended - started) / 1000), afterFirstBatch: ended > at ? (messages - count) / ((ended - at) / 1000) : 0 };
  });
}

/**
 * Producers commit at most this many transactions a second: one event per transaction costs a
 * commit each, and on two cores PostgreSQL commits about 1,300-2,000 single-event publishes a
 * second with nothing else running (measured), which would bound the lag runs before the relay
 * or the consumer did. Above this rate each transaction publishes several events.
 */
const PRODUCER_TX_PER_SECOND = 200;

/**
 * Events published at `rate` by producers in a process of their own, relayed by a relay in this
 * process and read from the broker by `reader` in a third: the commit-to-reading lag of the events
 * published after the warm-up, and of those published during it. Each of the three runs on an event
 * loop of its own, as they would be deployed (before session 40 they shared this process's, which
 * the producers and the reader kept busy at high rates).
 */
async function endToEndLag(setup: BrokerSetup, config: Config, kind: Kind, name: string, reader: LagReader, rate: number): Promise<{ lags: number[]; warmup: number[] }> {
  return withMailroom(config.serverUrl, name, async (mailroom, databaseUrl) => {
    const warmupEvents = Math.round(rate * config.lagWarmupSeconds);
    const totalEvents = warmupEvents + Math.round(rate * config.lagSeconds);
    await setup.prepare(name);
    const readerTask: LagReaderTask = { reader, kind, urls: config.urls, name, databaseUrl, expected: totalEvents };
    const readerProcess = forkTs('./brokers/lag-reader.ts', { [LAG_READER_ENV]: JSON.stringify(readerTask) });
    const producerTask: LagProducerTask = { databaseUrl, rate, perTx: Math.max(1, Math.ceil(rate / PRODUCER_TX_PER_SECOND)), warmupEvents, totalEvents };
    const producerProcess = forkTs('./brokers/lag-producer.ts', { [LAG_PRODUCER_ENV]: JSON.stringify(producerTask) });
    const relay = mailroom.relay({ to: [setup.target(name)], internal: false, pollInterval: 50 });
    relay.on('warning', () => {});
    relay.on('held-back', () => {}); // the publishers' own transactions, for a moment
    let monitor: NodeJS.Timeout | undefined;
    let batches = 0;
    let delivered = 0;
    relay.on('delivered', (info) => {
      batches += 1;
      delivered += info.count;
    });
    try {
      const allRead = nextMessage(readerProcess, (m: ChildAnswer) => answer(m, 'all'));
      allRead.catch(() => {}); // awaited below; a reader that ends early is reported there
      await nextMessage(readerProcess, (m: ChildAnswer) => answer(m, 'ready'));
      await nextMessage(producerProcess, (m: ChildAnswer) => answer(m, 'ready'));
      await relay.start();
      let busy = performance.eventLoopUtilization();
      monitor = process.env.BENCH_MONITOR
        ? setInterval(() => {
            const loop = performance.eventLoopUtilization(busy);
            busy = performance.eventLoopUtilization();
            void mailroom.stats().then((st) => {
              const r = Object.values(st.relay)[0];
              process.stderr.write(`    [monitor] relay unpublished ${r?.unpublished} held ${r?.heldBackBy ? 'yes' : 'no'}, group unfinished ${st.consumers.bench?.unfinished}, relay's event loop busy ${(loop.utilization * 100).toFixed(0)} %, ${batches} batches of ${(delivered / Math.max(1, batches)).toFixed(0)} events\n`);
              batches = 0;
              delivered = 0;
            });
          }, 1000)
        : undefined;
      producerProcess.send('go');
      const committed = await nextMessage(producerProcess, (m: ChildAnswer) => answer(m, 'committed'));
      await atMost(allRead, 60_000); // a minute at most for the last events to arrive
      readerProcess.send('stop');
      const arrivals = await nextMessage(readerProcess, (m: ChildAnswer) => answer(m, 'arrivals'));
      return lagsOf(committed, arrivals);
    } finally {
      clearInterval(monitor);
      for (const child of [producerProcess, readerProcess]) if (child.connected) child.disconnect(); // each exits when disconnected
      await relay.stop();
      await setup.cleanup(name).catch(() => {});
    }
  });
}

/** What the producer and reader processes answer; `error` when their work failed. */
interface ChildAnswer {
  ready?: true;
  all?: true;
  committed?: Committed;
  arrivals?: Arrivals;
  error?: string;
}

/** The answer's `key` part, undefined while it has none; throws the child's error. */
function answer<K extends keyof ChildAnswer>(m: ChildAnswer, key: K): NonNullable<ChildAnswer[K]> | undefined {
  if (m.error !== undefined) throw new Error(`a lag run's child process failed: ${m.error}`);
  return m[key] ?? undefined;
}

/** Each event's lag from its commit to its first arrival, the warm-up's apart. */
function lagsOf(committed: Committed, arrivals: Arrivals): { lags: number[]; warmup: number[] } {
  const index = new Map<string, number>();
  committed.ids.forEach((id, i) => index.set(id, i));
  const seen = new Set<string>();
  const lags: number[] = [];
  const warmup: number[] = [];
  arrivals.ids.forEach((id, i) => {
    const n = index.get(id);
    if (n === undefined || seen.has(id)) return;
    seen.add(id);
    (n < committed.warmupEvents ? warmup : lags).push(arrivals.at[i]! - committed.at[n]!);
  });
  return { lags, warmup };
}

async function main(): Promise<void> {
  const config = parseArgs(process.argv.slice(2));
  const restoreAutovacuum = config.autovacuum ? await enableAutovacuum(config.serverUrl) : undefined;
  if (restoreAutovacuum) process.stderr.write('autovacuum turned on for this run (ALTER SYSTEM); it is reset at the end\n');
  try {
    await measure(config);
  } finally {
    await restoreAutovacuum?.().catch((error: unknown) => process.stderr.write(`could not reset autovacuum (ALTER SYSTEM RESET autovacuum): ${String(error)}\n`));
  }
}

/** What the parent tells a broker's process: the run's settings, the broker, the run's name. */
interface BrokerTask {
  config: Config;
  kind: Kind;
  run: string;
}

const CHILD_ENV = 'MAILROOM_BENCH_BROKER_TASK';

/**
 * Each broker is measured in a fresh Node process, as `npm run bench` measures
 * each system, so that no pools, timers, heap or compiled code of the brokers
 * before it share its process. (Session 27 measured no difference beyond the
 * machine's noise; the separation keeps it so.)
 */
async function measure(config: Config): Promise<void> {
  const results: BrokerResult[] = [];
  const run = `mrbench_brk_${Date.now().toString(36)}`;
  for (const kind of config.only) {
    const task: BrokerTask = { config, kind, run };
    const child = forkTs('./brokers/main.ts', { [CHILD_ENV]: JSON.stringify(task) });
    results.push(await nextMessage(child, (m: { result: BrokerResult }) => m.result));
    child.disconnect();
  }
  console.log(`\nThe relay's figures are those of the round with the median share (of ${config.rounds}); a share is the relay against the higher ceiling beside it.`);
  console.log('\n| broker | ceiling (msg/s) | relay (events/s) | relay / ceiling | every round\'s share | after its first batch | lag: reader, rate (/s), p50 / p99 (ms) |');
  console.log('|---|---:|---:|---:|---|---:|---|');
  for (const r of results) {
    const lag = r.lag.map((l) => `${l.reader} ${l.ratePerSecond}/s: ${l.p50Ms} / ${l.p99Ms}`).join('; ');
    const steady = `${r.relayAfterFirstBatchPerSecond} (${(r.relayAfterFirstBatchOfCeiling * 100).toFixed(0)} %)`;
    const shares = r.rounds.map((round) => `${(round.relayOfCeiling * 100).toFixed(0)} %`).join(', ');
    console.log(`| ${r.kind} | ${r.ceilingPerSecond} | ${r.relayPerSecond} | ${(r.relayOfCeiling * 100).toFixed(0)} % | ${shares} | ${steady} | ${lag} |`);
  }
  if (config.json !== null) await writeFile(config.json, `${JSON.stringify({ messages: config.messages, rounds: config.rounds, lagSeconds: config.lagSeconds, lagWarmupSeconds: config.lagWarmupSeconds, autovacuum: config.autovacuum, results }, null, 2)}\n`);
}

/** One broker's ceiling, relay and lag runs, in this process (a child of {@link measure}). */
async function measureBroker({ config, kind, run }: BrokerTask): Promise<BrokerResult> {
  const setup = setups(config.urls)[kind];
  process.stderr.write(`${kind}:\n`);
  const ceilings = [(await setup.ceiling(config.messages)).perSecond];
  process.stderr.write(`  ceiling ${Math.round(ceilings[0]!)} msg/s\n`);
  const rounds: RelayRound[] = [];
  for (let i = 0; i < config.rounds; i++) {
    const relayName = `${run}_${kind}_relay${i}`;
    const measured = await relayThroughput(setup, config.serverUrl, relayName, config.messages).finally(() => setup.cleanup(relayName).catch(() => {}));
    const after = (await setup.ceiling(config.messages)).perSecond;
    const before = ceilings.at(-1)!;
    ceilings.push(after);
    const round: RelayRound = {
      ceilingBeforePerSecond: Math.round(before),
      ceilingAfterPerSecond: Math.round(after),
      relayPerSecond: Math.round(measured.fromStart),
      relayAfterFirstBatchPerSecond: Math.round(measured.afterFirstBatch),
      relayOfCeiling: Math.round((measured.fromStart / Math.max(before, after)) * 1000) / 1000,
    };
    rounds.push(round);
    process.stderr.write(
      `  relay   ${round.relayPerSecond} events/s (${(round.relayOfCeiling * 100).toFixed(0)} % of the higher ceiling beside it); after its first batch ${round.relayAfterFirstBatchPerSecond}; ceiling again ${round.ceilingAfterPerSecond} msg/s\n`,
    );
  }
  const median = [...rounds].sort((a, b) => a.relayOfCeiling - b.relayOfCeiling)[Math.floor(rounds.length / 2)]!;
  const ceiling = Math.max(median.ceilingBeforePerSecond, median.ceilingAfterPerSecond);
  const relay = median.relayPerSecond;
  const steady = median.relayAfterFirstBatchPerSecond;
  if (rounds.length > 1) process.stderr.write(`  the median round: relay ${relay} events/s, ${(median.relayOfCeiling * 100).toFixed(0)} % of ${ceiling}\n`);
  const lag: LagResult[] = [];
  for (const r of config.lagRates) {
    const rate = r === 'half' ? Math.round(relay / 2) : r;
    for (const reader of config.lagReaders) {
      const { lags, warmup } = await endToEndLag(setup, config, kind, `${run}_${kind}_lag${lag.length}`, reader, rate);
      const entry: LagResult = {
        reader,
        ratePerSecond: rate,
        events: lags.length,
        p50Ms: Math.round(percentile(lags, 50) * 10) / 10,
        p99Ms: Math.round(percentile(lags, 99) * 10) / 10,
        maxMs: Math.round(lags.reduce((a, b) => Math.max(a, b), 0) * 10) / 10, // spread overflows the stack past ~100k lags
        warmupEvents: warmup.length,
        warmupP99Ms: warmup.length === 0 ? 0 : Math.round(percentile(warmup, 99) * 10) / 10,
      };
      process.stderr.write(`  lag at ${rate}/s, read by the ${reader === 'group' ? 'group' : 'source alone'}: p50 ${entry.p50Ms} ms, p99 ${entry.p99Ms} ms, max ${entry.maxMs} ms (${lags.length} events; warm-up ${warmup.length} events, p99 ${entry.warmupP99Ms} ms)\n`);
      lag.push(entry);
    }
  }
  const result: BrokerResult = {
    kind,
    ceilingPerSecond: ceiling,
    ceilingRunsPerSecond: ceilings.map(Math.round),
    relayPerSecond: relay,
    relayOfCeiling: median.relayOfCeiling,
    relayAfterFirstBatchPerSecond: steady,
    relayAfterFirstBatchOfCeiling: Math.round((steady / ceiling) * 1000) / 1000,
    rounds,
    lag,
  };
  return result;
}

const task = process.env[CHILD_ENV];
if (task === undefined) await main();
else {
  const result = await measureBroker(JSON.parse(task) as BrokerTask);
  process.send!({ result });
  process.on('disconnect', () => process.exit(0));
}
