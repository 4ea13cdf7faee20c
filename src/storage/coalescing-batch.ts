interface Waiting<T, R> {
  item: T;
  resolve: (result: R) => void;
  reject: (error: unknown) => void;
}

/**
 * Turns many single requests into few statements: items handed in while a
 * batch is being written (or in the same turn of the event loop) go together
 * in the next one, up to `maxBatch`. Under load one statement serves many
 * callers; under light load an item is written at once.
 *
 * @example
 * const lookups = new CoalescingBatch<string, boolean>(async (keys) => {
 *   const found = await findKeys(keys);
 *   return keys.map((k) => found.has(k));
 * });
 * const seen = await lookups.add(key);
 */
export class CoalescingBatch<T, R> {
  private waiting: Waiting<T, R>[] = [];
  private running: Promise<void> | undefined;

  constructor(
    /** Writes one batch; resolves with one result per item, in order. A rejection rejects every item of the batch. */
    private readonly write: (items: T[]) => Promise<R[]>,
    private readonly maxBatch = 1000,
  ) {}

  /** Hands in one item; resolves with its result once its batch is written. */
  add(item: T): Promise<R> {
    return new Promise((resolve, reject) => {
      this.waiting.push({ item, resolve, reject });
      this.running ??= this.loop();
    });
  }

  /** Resolves every item not yet sent with `result`, as if written (a worker abandoning its completions). */
  settleUnsent(result: R): void {
    for (const w of this.waiting.splice(0)) w.resolve(result);
  }

  /** Resolves when everything handed in so far is written. */
  async drain(): Promise<void> {
    while (this.running) await this.running;
  }

  private async loop(): Promise<void> {
    try {
      await new Promise<void>((resolve) => setImmediate(resolve));
      while (this.waiting.length > 0) {
        const batch = this.waiting.splice(0, this.maxBatch);
        try {
          const results = await this.write(batch.map((w) => w.item));
          for (let i = 0; i < batch.length; i++) batch[i]!.resolve(results[i]!);
        } catch (error) {
          for (const w of batch) w.reject(error);
        }
      }
    } finally {
      this.running = undefined;
    }
  }
}
