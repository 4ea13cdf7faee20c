/**
 * Runs "actors" (each a list of database steps) under fast-check's scheduler, so
 * that the property explores (and shrinks) the order in which their steps run.
 *
 * - `stepwise`: one step at a time, each finished before the scheduler picks the
 *   next (every interleaving of whole statements; works on PGlite too).
 * - `overlap`: the scheduler picks the order in which steps *start*; a step does
 *   not wait for the others to finish, so on PostgreSQL the statements really run
 *   at once on separate connections (row locks, SKIP LOCKED, re-checked predicates).
 */
import type fc from 'fast-check';

export type Step<T = unknown> = () => Promise<T>;
export type Mode = 'stepwise' | 'overlap';

/** Runs every actor's steps in an order the scheduler chooses; resolves to each actor's step results. */
export async function interleave(s: fc.Scheduler, mode: Mode, actors: Record<string, Step[]>): Promise<Record<string, unknown[]>> {
  const results: Record<string, unknown[]> = {};
  const runs = Object.entries(actors).map(async ([name, steps]) => {
    const out: unknown[] = (results[name] = []);
    if (mode === 'stepwise') {
      let failure: unknown;
      const { task } = s.scheduleSequence(
        steps.map((step, i) => ({
          label: `${name} step ${i + 1}`,
          builder: async () => {
            try {
              out.push(await step());
            } catch (error) {
              failure = error;
              throw error;
            }
          },
        })),
      );
      const { faulty } = await task;
      if (faulty) throw failure;
      return;
    }
    for (const [i, step] of steps.entries()) {
      await s.schedule(Promise.resolve(), `${name} step ${i + 1}`);
      out.push(await step());
    }
  });
  await s.waitFor(Promise.all(runs));
  return results;
}
