/**
 * Runs a statement that touches at most `batchSize` rows again and again,
 * until a batch comes back short, `maxBatches` have run or `stopped()` says
 * so; resolves with the rows touched in all. The loop of every retention and
 * clean-up pass.
 *
 * @example
 * const pruned = await inBatches(1000, 100, () => driver.run(queries.pruneInbox, [group, retentionMs, 1000]));
 */
export async function inBatches(batchSize: number, maxBatches: number, batch: () => Promise<{ rowCount: number }>, stopped: () => boolean = () => false): Promise<number> {
  let total = 0;
  for (let i = 0; i < maxBatches && !stopped(); i++) {
    const { rowCount } = await batch();
    total += rowCount;
    if (rowCount < batchSize) break;
  }
  return total;
}
