/**
 * Runs async tasks one at a time, in the order they were handed in.
 *
 * The worker's multi-row writes to its own jobs (batched completions,
 * heartbeats, releases) go through one lane: PostgreSQL locks the rows of an
 * `UPDATE … FROM unnest(…)` in the order its plan meets them, not in the
 * order of the array, so two such statements over the same rows on two
 * connections can deadlock. One at a time, they cannot.
 */
export class SerialLane {
  private tail: Promise<unknown> = Promise.resolve();

  run<T>(task: () => Promise<T>): Promise<T> {
    const result = this.tail.then(task, task);
    this.tail = result.catch(() => undefined);
    return result;
  }
}
