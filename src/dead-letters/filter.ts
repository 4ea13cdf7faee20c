/**
 * The filter of the dead-letter queue (`deadLetters.list/replay/discard`):
 * checked field by field, with errors that name the field and say how to fix
 * it, then turned into the bind parameters of dead-letter-queries.ts.
 */
import { ValidationError } from '../errors.ts';
import { isUuid } from '../ids.ts';

/** Which dead letters to list, replay or discard. Every field narrows the selection. */
export interface DeadLetterFilter {
  /** The job's queue (a consumer group's queue is `consumer.<group>`). */
  queue?: string;
  /** The job type (or event type, for consumer groups; `mailroom.invalid-message` for messages that were not events). */
  type?: string;
  /** The last error's category (`permanent`, `validation`, `unknown-type`, …) or the dead reason (`max-attempts`, `max-age`). */
  category?: string;
  /** Died at or after: a Date, an ISO 8601 date/time, or a duration meaning "ago" (`'2h'`, `'3d'`). */
  since?: Date | string;
  /** Died at or before: same forms as `since`. */
  until?: Date | string;
  /** Only these job ids (UUIDs). */
  ids?: readonly string[];
  /** A case-insensitive substring of the last error message (`%` and `_` are plain characters). */
  text?: string;
  /** For replay and discard without any other field: yes, every dead letter. */
  all?: boolean;
}

/** A checked filter, as the statements take it. */
export interface ResolvedFilter {
  queue: string | null;
  type: string | null;
  category: string | null;
  since: Date | null;
  until: Date | null;
  ids: string[] | null;
  /** An ILIKE pattern: the text with `\`, `%`, `_` escaped, between `%`s. */
  textPattern: string | null;
  all: boolean;
  /** The filter as given, with times made absolute: what a replay record stores. */
  asRecorded: Record<string, unknown>;
}

const FIELDS = ['queue', 'type', 'category', 'since', 'until', 'ids', 'text', 'all'] as const;
const MAX_IDS = 10_000;
const AGO = /^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$/;
const AGO_MS: Record<string, number> = { s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 };
const ISO = /^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}(:?\d{2})?)?)?$/;

/** The accepted forms of a time, for error messages. */
export const TIME_FORMS = "an ISO 8601 date or date/time (2024-05-01, 2024-05-01T12:00:00Z) or a duration meaning that long ago (30m, 2h, 3d, 1w)";

function invalid(field: string, message: string): ValidationError {
  return new ValidationError(`dead-letter filter: ${field} ${message}`, [{ path: field, message }]);
}

/**
 * Reads a time: a Date, an ISO 8601 date/time, or a duration meaning "that long
 * before `now`" (`'2h'`, `'3d'`). Throws a ValidationError naming `field` and
 * the accepted forms.
 *
 * @example
 * parseTime('2h', 'since'); // two hours ago
 */
export function parseTime(value: unknown, field: string, now: number = Date.now()): Date {
  if (value instanceof Date) {
    if (Number.isNaN(value.getTime())) throw invalid(field, `is an invalid Date; give ${TIME_FORMS}`);
    return value;
  }
  if (typeof value !== 'string') throw invalid(field, `must be a Date or a string (${TIME_FORMS}), got ${typeOf(value)}`);
  const text = value.trim();
  const ago = AGO.exec(text);
  if (ago) return new Date(now - Number(ago[1]) * AGO_MS[ago[2]!]!);
  const at = ISO.test(text) ? new Date(text) : new Date(Number.NaN);
  if (Number.isNaN(at.getTime())) throw invalid(field, `${JSON.stringify(value)} is not a time; give ${TIME_FORMS}`);
  return at;
}

function typeOf(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value;
}

function text(raw: Record<string, unknown>, field: string): string | null {
  const value = raw[field];
  if (value === undefined) return null;
  if (typeof value !== 'string' || value === '') {
    throw invalid(field, `must be a non-empty string, got ${typeof value === 'string' ? 'an empty string' : typeOf(value)}; leave it out to match any ${field}`);
  }
  return value;
}

/** Escapes `\`, `%` and `_` so that `text` matches itself in a LIKE pattern (escape character `\`). */
export function escapeLike(text: string): string {
  return text.replace(/[\\%_]/g, (c) => `\\${c}`);
}

/**
 * Checks a filter and resolves it for the statements. Throws a
 * ValidationError naming the field for unknown fields, wrong types, a bad
 * time, `since` after `until`, or ids that are not UUIDs.
 *
 * @example
 * resolveFilter({ queue: 'email', since: '1d', text: '50% off' });
 */
export function resolveFilter(filter: unknown, now: number = Date.now()): ResolvedFilter {
  if (filter === undefined || filter === null) filter = {};
  if (typeof filter !== 'object' || Array.isArray(filter)) {
    throw new ValidationError(`dead-letter filter: must be an object such as { queue: 'email' }, got ${typeOf(filter)}`, [{ path: '', message: 'not an object' }]);
  }
  const raw = filter as Record<string, unknown>;
  for (const key of Object.keys(raw)) {
    if (!(FIELDS as readonly string[]).includes(key)) {
      const hint = key === 'id' ? '; use ids: [id]' : key === 'queues' || key === 'types' ? `; give one ${key.slice(0, -1)}` : '';
      throw invalid(key, `is not a filter field${hint}; the fields are ${FIELDS.join(', ')}`);
    }
  }
  const since = raw.since === undefined ? null : parseTime(raw.since, 'since', now);
  const until = raw.until === undefined ? null : parseTime(raw.until, 'until', now);
  if (since && until && since.getTime() > until.getTime()) {
    throw invalid('since', `(${since.toISOString()}) is after until (${until.toISOString()}); swap them or widen the range`);
  }
  let ids: string[] | null = null;
  if (raw.ids !== undefined) {
    if (!Array.isArray(raw.ids)) throw invalid('ids', `must be an array of job ids (UUIDs), got ${typeOf(raw.ids)}`);
    if (raw.ids.length === 0) throw invalid('ids', 'is empty; give at least one job id, or leave ids out');
    if (raw.ids.length > MAX_IDS) throw invalid('ids', `has ${raw.ids.length} ids, more than ${MAX_IDS}; split the list, or select by another field`);
    const bad = raw.ids.findIndex((id) => !isUuid(id));
    if (bad >= 0) throw invalid(`ids[${bad}]`, `${JSON.stringify(raw.ids[bad])} is not a job id; job ids are UUIDs like 0193a5b2-7c1d-7e2f-8a3b-4c5d6e7f8091`);
    ids = [...new Set((raw.ids as string[]).map((id) => id.toLowerCase()))];
  }
  if (raw.all !== undefined && typeof raw.all !== 'boolean') throw invalid('all', `must be true or false, got ${typeOf(raw.all)}`);
  const search = text(raw, 'text');
  const resolved = {
    queue: text(raw, 'queue'),
    type: text(raw, 'type'),
    category: text(raw, 'category'),
    since,
    until,
    ids,
    textPattern: search === null ? null : `%${escapeLike(search)}%`,
    all: raw.all === true,
  };
  const asRecorded: Record<string, unknown> = {};
  for (const key of FIELDS) {
    if (raw[key] === undefined) continue;
    asRecorded[key] = key === 'since' ? since!.toISOString() : key === 'until' ? until!.toISOString() : key === 'ids' ? ids : raw[key];
  }
  return { ...resolved, asRecorded };
}

/** True when the filter names at least one criterion (not counting `all`). */
export function hasCriterion(filter: ResolvedFilter): boolean {
  return [filter.queue, filter.type, filter.category, filter.since, filter.until, filter.ids, filter.textPattern].some((v) => v !== null);
}

/**
 * Refuses a replay or discard of everything by accident: a filter with no
 * criterion needs `all: true`.
 */
export function requireCriterion(filter: ResolvedFilter, action: 'replay' | 'discard'): void {
  if (hasCriterion(filter) || filter.all) return;
  throw new ValidationError(
    `dead-letter ${action}: the filter is empty, which would ${action} every dead letter; give at least one of queue, type, category, since, until, ids, text, or pass { all: true } to mean every dead letter`,
    [{ path: 'all', message: 'an empty filter needs all: true' }],
  );
}

/** The filter's bind parameters in the order of dead-letter-queries.ts ($1..$7). */
export function filterParams(filter: ResolvedFilter): unknown[] {
  return [filter.queue, filter.type, filter.category, filter.since, filter.until, filter.ids, filter.textPattern];
}
