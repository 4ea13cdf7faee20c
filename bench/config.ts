/** Command-line options of `npm run bench`, and the sizes of each mode. */
import { isSystemId, SYSTEMS, type SystemId } from './adapters/index.ts';

export const WORKLOADS = ['drain', 'enqueue', 'latency', 'scale', 'ceiling'] as const;
export type WorkloadId = (typeof WORKLOADS)[number];

export interface BenchConfig {
  mode: 'default' | 'quick';
  big: boolean;
  json: boolean;
  out: string | undefined;
  serverUrl: string;
  redisUrl: string;
  systems: SystemId[];
  workloads: WorkloadId[];
  /** drain */
  jobs: number;
  concurrency: number;
  batch: number;
  /** enqueue */
  single: number;
  bulk: number;
  /** latency */
  rate: number;
  latencyJobs: number;
  /** Idle time before the first latency job, ms. */
  idleMs: number;
  /** scale */
  scaleJobs: number;
  processes: number[];
  backlogs: number[];
  /** Ordering keys of the ordered drain (0: skip it). */
  orderingKeys: number;
  /** Jobs each scale process drains on a queue of its own before the clock starts (0: none). */
  scaleWarmUp: number;
  /** ceiling */
  ceilingSeconds: number;
  claimBatch: number;
  claimLoops: number;
  /** Turn the server's autovacuum on for the run (and back off after) when it is off. */
  autovacuum: boolean;
  /** Interleaved rounds of drain and enqueue, and interleaved rounds of the scale backlogs; the median is reported. */
  rounds: number;
  timeoutMs: number;
}

export const HELP = `npm run bench [-- OPTIONS]

Measures mailroom beside graphile-worker, pg-boss, BullMQ on Redis and BullMQ's
PostgreSQL backend on this machine, in one run, and the PostgreSQL ceiling.

  --quick               small sizes: the whole run takes under a minute
  --big                 add a 1,000,000-job backlog to the scale workload
  --autovacuum          turn the server's autovacuum on for the run if it is off (PostgreSQL's
                        default; ALTER SYSTEM + reload, reset at the end; needs a superuser)
  --json                print the results as JSON (the table goes to stderr)
  --out FILE            also write the JSON results to FILE
  --systems a,b         among: ${SYSTEMS.join(', ')}
  --only w,x            workloads among: ${WORKLOADS.join(', ')}
  --database URL        PostgreSQL server (default $BENCH_DATABASE_URL or postgres://postgres@127.0.0.1:5432/postgres);
                        a database is created and dropped for each system and workload
  --redis URL           Redis for BullMQ (default $BENCH_REDIS_URL or redis://127.0.0.1:6379)
  --rounds N            drain and enqueue: interleaved rounds, median reported; scale: rounds of
                        the backlogs, interleaved, each backlog's median steady rate reported
                        (default 3; quick 1)
  --jobs N              drain: jobs enqueued then drained (default 20000; quick 2000)
  --concurrency N       total concurrency of every system's workers (default 20)
  --batch N             jobs per bulk enqueue call (default 1000)
  --single N            enqueue: jobs enqueued one at a time (default 2000; quick 300)
  --bulk N              enqueue: jobs enqueued in bulk (default 20000; quick 2000)
  --rate N              latency: jobs per second (default 100)
  --latency-jobs N      latency: jobs measured (default 3000; quick 100)
  --scale-jobs N        scale: jobs drained by 1, 2 and 4 processes (default 20000; quick 2000)
  --processes 1,2,4     scale: worker process counts
  --backlogs A,B        scale: backlog sizes (default 10000,100000; quick 2000,10000; --big adds 1000000)
  --ordering-keys N     scale: also drain the 1-process jobs spread over N ordering keys (default 100; 0: skip)
  --scale-warm-up N     scale: jobs each process drains on a queue of its own before the clock starts
                        (default 5000; quick 500; 0: none)
  --ceiling-seconds N   ceiling: seconds per pgbench run (default 5; quick 1)
  --claim-batch N       ceiling: rows per claim statement (default 100)
  --claim-loops N       ceiling: connections claiming at once (default 4)
`;

function positiveInt(name: string, value: string | undefined): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new Error(`${name} must be a positive integer, got ${JSON.stringify(value)}`);
  return n;
}

function intList(name: string, value: string | undefined): number[] {
  if (!value) throw new Error(`${name} needs a value`);
  return value.split(',').map((v) => positiveInt(name, v));
}

export function parseArgs(argv: readonly string[]): BenchConfig | 'help' {
  const quick = argv.includes('--quick');
  const big = argv.includes('--big');
  const c: BenchConfig = {
    mode: quick ? 'quick' : 'default',
    big,
    json: false,
    out: undefined,
    serverUrl: process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres',
    redisUrl: process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379',
    systems: [...SYSTEMS],
    workloads: [...WORKLOADS],
    jobs: quick ? 2000 : 20_000,
    concurrency: 20,
    batch: 1000,
    single: quick ? 300 : 2000,
    bulk: quick ? 2000 : 20_000,
    rate: 100,
    latencyJobs: quick ? 100 : 3000,
    idleMs: quick ? 300 : 1000,
    scaleJobs: quick ? 2000 : 20_000,
    processes: [1, 2, 4],
    backlogs: quick ? [2000, 10_000] : [10_000, 100_000],
    orderingKeys: 100,
    scaleWarmUp: quick ? 500 : 5000,
    ceilingSeconds: quick ? 1 : 5,
    claimBatch: 1000,
    claimLoops: 4,
    autovacuum: false,
    rounds: quick ? 1 : 3,
    timeoutMs: 600_000,
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const value = () => {
      const v = argv[++i];
      if (v === undefined) throw new Error(`${arg} needs a value`);
      return v;
    };
    switch (arg) {
      case '--help':
      case '-h':
        return 'help';
      case '--quick':
      case '--big':
        break;
      case '--json':
        c.json = true;
        break;
      case '--out':
        c.out = value();
        break;
      case '--database':
        c.serverUrl = value();
        break;
      case '--redis':
        c.redisUrl = value();
        break;
      case '--systems': {
        const ids = value().split(',');
        for (const id of ids) if (!isSystemId(id)) throw new Error(`unknown system ${JSON.stringify(id)}; known: ${SYSTEMS.join(', ')}`);
        c.systems = SYSTEMS.filter((s) => ids.includes(s));
        break;
      }
      case '--only': {
        const ids = value().split(',');
        for (const id of ids) if (!(WORKLOADS as readonly string[]).includes(id)) throw new Error(`unknown workload ${JSON.stringify(id)}; known: ${WORKLOADS.join(', ')}`);
        c.workloads = WORKLOADS.filter((w) => ids.includes(w));
        break;
      }
      case '--rounds':
        c.rounds = positiveInt(arg, value());
        break;
      case '--jobs':
        c.jobs = positiveInt(arg, value());
        break;
      case '--concurrency':
        c.concurrency = positiveInt(arg, value());
        break;
      case '--batch':
        c.batch = positiveInt(arg, value());
        break;
      case '--single':
        c.single = positiveInt(arg, value());
        break;
      case '--bulk':
        c.bulk = positiveInt(arg, value());
        break;
      case '--rate':
        c.rate = positiveInt(arg, value());
        break;
      case '--latency-jobs':
        c.latencyJobs = positiveInt(arg, value());
        break;
      case '--scale-jobs':
        c.scaleJobs = positiveInt(arg, value());
        break;
      case '--processes':
        c.processes = intList(arg, value());
        break;
      case '--backlogs':
        c.backlogs = intList(arg, value());
        break;
      case '--ordering-keys':
        c.orderingKeys = Number(value());
        if (!Number.isInteger(c.orderingKeys) || c.orderingKeys < 0) throw new Error('--ordering-keys must be an integer, 0 or more');
        break;
      case '--scale-warm-up':
        c.scaleWarmUp = Number(value());
        if (!Number.isInteger(c.scaleWarmUp) || c.scaleWarmUp < 0) throw new Error('--scale-warm-up must be an integer, 0 or more');
        break;
      case '--autovacuum':
        c.autovacuum = true;
        break;
      case '--ceiling-seconds':
        c.ceilingSeconds = positiveInt(arg, value());
        break;
      case '--claim-batch':
        c.claimBatch = positiveInt(arg, value());
        break;
      case '--claim-loops':
        c.claimLoops = positiveInt(arg, value());
        break;
      default:
        throw new Error(`unknown option ${arg} (see --help)`);
    }
  }
  if (big && !c.backlogs.includes(1_000_000)) c.backlogs.push(1_000_000);
  if (!/^postgres(ql)?:\/\//.test(c.serverUrl)) throw new Error('--database must be a postgres:// URL');
  return c;
}
