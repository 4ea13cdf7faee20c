/**
 * The producers of a `bench:brokers` lag run, in a process of their own: another application
 * publishing to the outbox, as it would be deployed. Forked by main.ts with the task in
 * LAG_PRODUCER_ENV; answers `{ ready }` once connected, publishes when told `'go'`, and answers
 * `{ committed }` with each event's id and the time its transaction committed (`now()`, a clock
 * the other processes of the run share), as this process saw it: when it handled the reply to the
 * `COMMIT`, which on a loaded machine can be after a reader already has the event.
 */
import { createMailroom, type Mailroom } from '../../dist/index.js';
import { now, sleep } from '../stats.ts';
import { noted, PAD } from './setups.ts';

export const LAG_PRODUCER_ENV = 'MAILROOM_BENCH_LAG_PRODUCER';

/** What main.ts tells the producers. */
export interface LagProducerTask {
  databaseUrl: string;
  /** Events a second. */
  rate: number;
  /** Events per transaction (one per transaction up to main.ts's PRODUCER_TX_PER_SECOND). */
  perTx: number;
  warmupEvents: number;
  totalEvents: number;
}

/** Each event's id and commit time, in publishing order; the first `warmupEvents` are the warm-up's. */
export interface Committed {
  ids: string[];
  at: Float64Array;
  warmupEvents: number;
}

async function produce(task: LagProducerTask, producers: Mailroom): Promise<Committed> {
  const ids = new Array<string>(task.totalEvents);
  const at = new Float64Array(task.totalEvents);
  try {
    const tickMs = 10;
    const started = now();
    const inFlight = new Set<Promise<void>>();
    for (let sent = 0; sent < task.totalEvents; ) {
      const due = Math.min(task.totalEvents, Math.floor(((now() - started) / 1000) * task.rate));
      while (due - sent >= task.perTx || (due === task.totalEvents && sent < task.totalEvents)) {
        const first = sent;
        // A transaction does not straddle the warm-up's end, so each event's part is its own.
        const end = first < task.warmupEvents ? task.warmupEvents : task.totalEvents;
        const items = Array.from({ length: Math.min(task.perTx, end - first) }, (_, i) => ({ n: first + i, pad: PAD }));
        sent += items.length;
        const p = producers.publishMany(noted, items, { key: (item) => `order-${item.n % 10_000}` }).then((published) => {
          const committedAt = now();
          published.ids.forEach((id, i) => {
            ids[first + i] = id;
            at[first + i] = committedAt;
          });
        });
        inFlight.add(p);
        void p.finally(() => inFlight.delete(p));
      }
      await sleep(tickMs);
    }
    await Promise.all(inFlight);
  } finally {
    await producers.close();
  }
  return { ids, at, warmupEvents: task.warmupEvents };
}

const task = JSON.parse(process.env[LAG_PRODUCER_ENV] ?? 'null') as LagProducerTask | null;
if (task !== null) {
  const producers = await createMailroom({ database: task.databaseUrl, poolSize: 4 });
  process.once('message', (message) => {
    if (message !== 'go') return;
    void produce(task, producers).then(
      (committed) => process.send!({ committed }),
      (error: unknown) => process.send!({ error: error instanceof Error ? error.message : String(error) }),
    );
  });
  process.send!({ ready: true });
  process.on('disconnect', () => process.exit(0));
}
