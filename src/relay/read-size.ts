/**
 * How many rows a relay target's next read asks for.
 *
 * With `batchSize` given, always that many. Left to the default, a read asks
 * for {@link DEFAULT_BATCH_SIZE} rows while events trickle in, and for twice
 * as many after each full read that left more waiting (a backlog), up to
 * {@link GROWN_BATCH_SIZE}, as long as a batch's envelopes stay within
 * {@link BATCH_CHARACTERS}; a read that reaches the end of what can be
 * delivered starts over. A target whose every round waits for a broker's
 * confirm (RabbitMQ: 10-30 ms here) moves about one batch per wait: with
 * 50,000 events waiting, the relay to RabbitMQ moved 12,660-16,198 events/s
 * at a fixed 100 and 24,265-24,716 growing (docs/BENCHMARKS.md, session 22).
 * While events trickle in, reads come back short and stay at the base.
 */
import type { BatchPlan } from './read-batch.ts';

/** Rows per read while nothing is waiting behind them. */
export const DEFAULT_BATCH_SIZE = 100;
/** The most rows a default-sized read grows to during a backlog. */
export const GROWN_BATCH_SIZE = 1000;
/** A batch whose envelopes hold more characters than this (4 Mi) makes the next read smaller, never larger. */
export const BATCH_CHARACTERS = 4 * 1024 * 1024;

/**
 * One target's read size (see the module comment).
 *
 * @example
 * const size = ReadSize.of(options.batchSize); // undefined: the default, growing
 * const plan = await planBatch(db, queries, cursor, fence, size.current);
 * size.after(plan);
 */
export class ReadSize {
  #current: number;

  private constructor(
    private readonly base: number,
    private readonly most: number,
  ) {
    this.#current = base;
  }

  /** A fixed size when `batchSize` was given, else the default's growing one. */
  static of(batchSize: number | undefined): ReadSize {
    return batchSize === undefined ? new ReadSize(DEFAULT_BATCH_SIZE, GROWN_BATCH_SIZE) : new ReadSize(batchSize, batchSize);
  }

  /** How many rows the next read asks for. */
  get current(): number {
    return this.#current;
  }

  /** Takes account of a batch read with the current size. */
  after(plan: Pick<BatchPlan, 'rows' | 'exhausted' | 'blockedBy'>): void {
    if (this.base === this.most) return;
    if (plan.exhausted || plan.blockedBy !== null) {
      this.#current = this.base;
      return;
    }
    let characters = 0;
    for (const row of plan.rows) characters += row.body.length;
    if (characters > BATCH_CHARACTERS) this.#current = Math.max(this.base, this.#current >> 1);
    else if (plan.rows.length >= this.#current && characters * 2 <= BATCH_CHARACTERS) this.#current = Math.min(this.most, this.#current * 2);
  }
}
