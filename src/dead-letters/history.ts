/**
 * A job's replays and discards in its history: `jobs.get(id).history` (and
 * `deadLetters.show`) gain, for each time the job was taken out of the
 * dead-letter queue, the death it came from and a `replayed` / `discarded`
 * line with when and by whom.
 */
import type { JobHistoryEntry, JobInfo } from '../jobs/get.ts';
import type { Driver } from '../storage/driver.ts';
import type { DeadLetterQueries } from './dead-letter-queries.ts';

interface ReplayOfJobRow {
  id: string;
  action: 'replay' | 'discard';
  by: string | null;
  at: Date;
  died_at: Date | null;
  dead_reason: string | null;
  attempt: number;
}

/**
 * Returns `info` with its replays and discards woven into the history (oldest first).
 *
 * @example
 * const job = await withReplayHistory(driver, queries, await getJob(driver, jobQueries, id));
 */
export async function withReplayHistory(driver: Driver, queries: DeadLetterQueries, info: JobInfo | undefined): Promise<JobInfo | undefined> {
  if (!info) return info;
  const { rows } = await driver.run<ReplayOfJobRow>(queries.replaysOf, [info.id]);
  if (rows.length === 0) return info;
  let history = [...info.history];
  const deathAt = new Set(history.filter((e) => e.event === 'dead-lettered').map((e) => e.at.getTime()));
  for (const row of rows) {
    if (row.died_at && !deathAt.has(row.died_at.getTime())) {
      const death: JobHistoryEntry = { at: row.died_at, event: 'dead-lettered', attempt: row.attempt };
      if (row.dead_reason) death.detail = row.dead_reason;
      history.push(death);
    }
    const entry: JobHistoryEntry = { at: row.at, event: row.action === 'replay' ? 'replayed' : 'discarded', detail: `${row.action} ${row.id}${row.by ? ` by ${row.by}` : ''}` };
    if (row.by) entry.by = row.by;
    history.push(entry);
    // A discard is a cancellation: one line for it, not two.
    if (row.action === 'discard') history = history.filter((e) => !(e.event === 'cancelled' && e.at.getTime() === row.at.getTime()));
  }
  history.sort((a, b) => a.at.getTime() - b.at.getTime());
  return { ...info, history };
}
