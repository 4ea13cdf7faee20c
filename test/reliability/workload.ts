/**
 * The producers of a reliability scenario: transactions of 1-4 operations
 * (jobs, some with an ordering key and some failing their first attempt;
 * keyed events), some rolled back on purpose, each operation logged in an
 * {@link OpLog} as invoked and then settled by how its transaction ended.
 *
 * Each producer owns its keys and runs one transaction at a time, so a key's
 * operations are invoked one after the other: an `ok` one committed before
 * the next began (the checker's order rule relies on it).
 */
import type { Mailroom } from '../../src/index.ts';
import type { RetryOptions } from '../../src/index.ts';
import { INPROC_GROUP, RABBIT_GROUP, relEvent, relJob } from './definitions.ts';
import type { Op, OpLog } from './history.ts';

export interface WorkloadOptions {
  mailroom: Mailroom;
  log: OpLog;
  retry: RetryOptions;
  producers: number;
  /** Ordering keys of jobs and event keys per producer. */
  keysPerProducer: number;
  /** Whether events also go to the RabbitMQ group. */
  rabbit: boolean;
  /** Pause between a producer's transactions, [min, max] ms. */
  pauseMs: [number, number];
  /** Stop after this many operations in all (the workload also stops when `stop()` is called). */
  maxOps: number;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
const randomInt = (min: number, max: number) => min + Math.floor(Math.random() * (max - min + 1));

class RollbackOnPurpose extends Error {
  override name = 'RollbackOnPurpose';
}

/** A running workload: `stop()` ends it after the transactions in flight. */
export interface RunningWorkload {
  stop(): Promise<void>;
  /** Resolves when the producers are done (stopped, or maxOps reached). */
  done: Promise<void>;
  readonly transactions: { committed: number; failed: number; rolledBack: number; unknown: number };
  /** Transactions begun so far: an operation whose `tx` is at least this began after now. */
  begun(): number;
}

/** Starts the producers. */
export function startWorkload(options: WorkloadOptions): RunningWorkload {
  const { mailroom, log } = options;
  const job = relJob(options.retry);
  const eventDestinations = options.rabbit ? [INPROC_GROUP, RABBIT_GROUP] : [INPROC_GROUP];
  const transactions = { committed: 0, failed: 0, rolledBack: 0, unknown: 0 };
  let stopping = false;
  let invoked = 0;
  let begun = 0;

  const producer = async (p: number) => {
    const seqs = new Map<string, number>();
    const next = (key: string) => {
      const seq = seqs.get(key) ?? 0;
      seqs.set(key, seq + 1);
      return seq;
    };
    while (!stopping && invoked < options.maxOps) {
      const rollback = Math.random() < 0.1;
      const ops: Op[] = [];
      let committing = false;
      const tx = begun++;
      try {
        await mailroom.transaction(async (handle) => {
          for (let i = randomInt(1, 4); i > 0; i--) {
            const pick = Math.random();
            const k = randomInt(0, options.keysPerProducer - 1);
            if (pick < 0.45) {
              const key = `e${p}-${k}`;
              const op = log.invoke({ kind: 'publish', destinations: eventDestinations, key, seq: next(key), tx });
              ops.push(op);
              await mailroom.publish(relEvent, { op: op.id, key, seq: op.seq! }, { tx: handle, key });
            } else {
              const key = pick < 0.8 ? `j${p}-${k}` : null;
              const op = log.invoke({ kind: 'enqueue', destinations: [job.queue], key, seq: key === null ? null : next(key), tx });
              ops.push(op);
              await mailroom.enqueue(job, { op: op.id, key, seq: op.seq, failFirst: Math.random() < 0.15 }, { tx: handle, ...(key === null ? {} : { orderingKey: key }) });
            }
            invoked++;
          }
          if (rollback) throw new RollbackOnPurpose('rolled back on purpose by the workload');
          committing = true; // what fails from here on is COMMIT itself: it may have committed
        });
        log.settle(ops, 'ok');
        transactions.committed++;
      } catch (error) {
        if (error instanceof RollbackOnPurpose) {
          log.settle(ops, 'rolled-back');
          transactions.rolledBack++;
        } else if (committing) {
          log.settle(ops, 'unknown', error);
          transactions.unknown++;
        } else {
          log.settle(ops, 'failed', error);
          transactions.failed++;
          await sleep(50); // the database is away: do not spin
        }
      }
      await sleep(randomInt(...options.pauseMs));
    }
  };

  const done = Promise.all(Array.from({ length: options.producers }, (_, p) => producer(p))).then(() => {});
  return {
    done,
    transactions,
    begun: () => begun,
    async stop() {
      stopping = true;
      await done;
    },
  };
}
