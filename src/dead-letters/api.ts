/** `mailroom.deadLetters`: the dead-letter queue as a work surface (docs/DEAD-LETTERS.md). */
import type { JobQueries } from '../jobs/queries.ts';
import type { Driver } from '../storage/driver.ts';
import type { DeadLetterQueries } from './dead-letter-queries.ts';
import type { DeadLetterDetail } from './dead-letter.ts';
import type { DeadLetterFilter } from './filter.ts';
import { listDeadLetters, showDeadLetter, type DeadLetterPage, type ListOptions } from './list.ts';
import { discardDeadLetters, replayDeadLetters, type DiscardOptions, type DiscardResult, type ReplayOptions, type ReplayResult } from './replay.ts';

/** Read, replay and discard dead letters (jobs in state `dead`). */
export interface DeadLettersApi {
  /**
   * A page of dead letters matching `filter`, newest death first; pass `next`
   * back as `cursor` for the following page. Payloads are redacted.
   *
   * @example
   * const { items, next } = await mailroom.deadLetters.list({ queue: 'email', since: '1d', text: 'timeout' }, { limit: 100 });
   */
  list(filter?: DeadLetterFilter, options?: ListOptions): Promise<DeadLetterPage>;
  /**
   * One dead letter with every error and its full history, or undefined when
   * no dead job has this id.
   *
   * @example
   * const letter = await mailroom.deadLetters.show(id); console.log(letter?.history);
   */
  show(id: string): Promise<DeadLetterDetail | undefined>;
  /**
   * Puts matching dead letters back to `available` in place (same id, history
   * kept) with fresh attempts, in small transactions; rate-limited, abortable,
   * recorded. An empty filter needs `{ all: true }`.
   *
   * @example
   * await mailroom.deadLetters.replay({ queue: 'email', category: 'transient' }, { ratePerSecond: 10, dryRun: true });
   */
  replay(filter: DeadLetterFilter, options?: ReplayOptions): Promise<ReplayResult>;
  /**
   * Moves matching dead letters to `cancelled` (their ordering keys are let go),
   * recorded like a replay. An empty filter needs `{ all: true }`.
   *
   * @example
   * await mailroom.deadLetters.discard({ type: 'mailroom.invalid-message', until: '7d' });
   */
  discard(filter: DeadLetterFilter, options?: DiscardOptions): Promise<DiscardResult>;
}

/** What {@link deadLettersApi} needs from the mailroom. */
export interface DeadLettersDeps {
  driver: Driver;
  queries: DeadLetterQueries;
  jobQueries: JobQueries;
  redactPaths: readonly string[];
  ownerOf(queue: string): string | null;
  /** The NOTIFY channel that wakes workers. */
  wakeChannel: string;
  /** Turns a database error into one that says what to do (rethrows it). */
  fail(error: unknown): never;
}

/** Makes `mailroom.deadLetters`. */
export function deadLettersApi(deps: DeadLettersDeps): DeadLettersApi {
  const read = { driver: deps.driver, queries: deps.queries, jobQueries: deps.jobQueries, redactPaths: deps.redactPaths, ownerOf: (q: string) => deps.ownerOf(q) };
  const bulk = { driver: deps.driver, queries: deps.queries, wakeChannel: deps.wakeChannel };
  return {
    list: (filter, options) => listDeadLetters(read, filter, options).catch((e) => deps.fail(e)),
    show: (id) => showDeadLetter(read, id).catch((e) => deps.fail(e)),
    replay: (filter, options) => replayDeadLetters(bulk, filter, options).catch((e) => deps.fail(e)),
    discard: (filter, options) => discardDeadLetters(bulk, filter, options).catch((e) => deps.fail(e)),
  };
}
