/** Reading the dead-letter queue: a filtered page (`list`) and one dead letter with its history (`show`). */
import { ValidationError } from '../errors.ts';
import { getJob } from '../jobs/get.ts';
import type { JobQueries } from '../jobs/queries.ts';
import type { Driver } from '../storage/driver.ts';
import { decodeCursor, encodeCursor } from './cursor.ts';
import type { DeadLetterQueries } from './dead-letter-queries.ts';
import { toDeadLetter, type DeadLetter, type DeadLetterDetail, type DeadLetterRow, type Presentation } from './dead-letter.ts';
import { filterParams, resolveFilter, type DeadLetterFilter } from './filter.ts';
import { withReplayHistory } from './history.ts';

/** Paging of `deadLetters.list`. */
export interface ListOptions {
  /** Items per page, 1 to 1000. Default 50. */
  limit?: number;
  /** The `next` of the previous page. */
  cursor?: string | null;
}

/** One page of dead letters, newest death first. */
export interface DeadLetterPage {
  items: DeadLetter[];
  /** Pass as `cursor` for the next page; null on the last page. */
  next: string | null;
}

/** What reading the dead-letter queue needs. */
export interface ReadDeps extends Presentation {
  driver: Driver;
  queries: DeadLetterQueries;
  jobQueries: JobQueries;
}

const DEFAULT_LIMIT = 50;
const MAX_LIMIT = 1000;

function checkListOptions(options: unknown): { limit: number; cursor: string | null } {
  if (options === undefined || options === null) return { limit: DEFAULT_LIMIT, cursor: null };
  if (typeof options !== 'object' || Array.isArray(options)) {
    throw new ValidationError('dead-letter list: options must be an object such as { limit: 50, cursor }', [{ path: 'options', message: 'not an object' }]);
  }
  const { limit = DEFAULT_LIMIT, cursor = null, ...rest } = options as ListOptions & Record<string, unknown>;
  const unknown = Object.keys(rest)[0];
  if (unknown !== undefined) {
    throw new ValidationError(`dead-letter list: ${unknown} is not an option; the options are limit and cursor (the filter is the first argument)`, [
      { path: unknown, message: 'unknown option' },
    ]);
  }
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LIMIT) {
    throw new ValidationError(`dead-letter list: limit must be a whole number from 1 to ${MAX_LIMIT}, got ${JSON.stringify(limit)}`, [
      { path: 'limit', message: 'out of range' },
    ]);
  }
  return { limit, cursor };
}

/**
 * A page of dead letters matching `filter`, newest death first, keyset-paged.
 *
 * @example
 * let page = await listDeadLetters(deps, { queue: 'email' }, { limit: 100 });
 * while (page.next) page = await listDeadLetters(deps, { queue: 'email' }, { cursor: page.next });
 */
export async function listDeadLetters(deps: ReadDeps, filter: DeadLetterFilter | undefined, options?: ListOptions): Promise<DeadLetterPage> {
  const resolved = resolveFilter(filter);
  const { limit, cursor } = checkListOptions(options);
  const after = cursor === null ? null : decodeCursor(cursor);
  const { rows } = await deps.driver.run<DeadLetterRow>(deps.queries.list, [...filterParams(resolved), after?.diedAt ?? null, after?.id ?? null, limit + 1]);
  const page = rows.slice(0, limit);
  const last = page.at(-1);
  return {
    items: page.map((row) => toDeadLetter(row, deps)),
    next: rows.length > limit && last ? encodeCursor({ diedAt: last.died_at_exact, id: last.id }) : null,
  };
}

/**
 * One dead letter with its errors and full history, or undefined when there
 * is no dead job with this id (it never existed, was pruned, or is no longer dead).
 *
 * @example
 * const letter = await showDeadLetter(deps, id); console.log(letter?.history);
 */
export async function showDeadLetter(deps: ReadDeps, id: string): Promise<DeadLetterDetail | undefined> {
  const info = await withReplayHistory(deps.driver, deps.queries, await getJob(deps.driver, deps.jobQueries, id));
  if (!info || info.state !== 'dead') return undefined;
  // The same shape as a listed row, so both go through toDeadLetter.
  const row: DeadLetterRow = {
    id: info.id,
    queue: info.queue,
    type: info.type,
    dead_reason: info.deadReason,
    last_error: info.lastError,
    attempt: info.attempts,
    max_attempts: info.maxAttempts,
    correlation_id: info.correlationId,
    created_at: info.createdAt,
    finished_at: info.finishedAt ?? info.createdAt,
    payload: info.data,
    died_at_exact: '',
  };
  return {
    ...toDeadLetter(row, deps),
    key: info.key,
    orderingKey: info.orderingKey,
    priority: info.priority,
    errors: info.errors,
    history: info.history,
  };
}
