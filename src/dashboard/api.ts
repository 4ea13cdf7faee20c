/**
 * The dashboard's JSON API: what the page shows, read through mailroom's
 * own calls (so payloads are redacted as configured), and the two actions
 * (replay, discard) behind the token, a same-origin check and read-only mode.
 */
import type { IncomingMessage } from 'node:http';
import { MailroomError, ValidationError } from '../errors.ts';
import type { Mailroom } from '../mailroom.ts';
import type { DeadLetterFilter } from '../dead-letters/filter.ts';

/** An answer: a status and a JSON body. */
export interface ApiAnswer {
  status: number;
  body: unknown;
}

const FILTER_FIELDS = ['queue', 'type', 'category', 'since', 'until', 'text'] as const;
const MAX_BODY_BYTES = 64 * 1024;

const ok = (body: unknown): ApiAnswer => ({ status: 200, body });
const fail = (status: number, error: string): ApiAnswer => ({ status, body: { error } });

/** A dead-letter filter from query parameters or a JSON body: the known fields only, as strings. */
function filterFrom(source: Record<string, unknown>): DeadLetterFilter {
  const filter: Record<string, string | boolean | string[]> = {};
  for (const field of FILTER_FIELDS) {
    const value = source[field];
    if (typeof value === 'string' && value !== '') filter[field] = value;
  }
  if (Array.isArray(source.ids) && source.ids.every((id) => typeof id === 'string')) filter.ids = source.ids as string[];
  if (source.all === true) filter.all = true;
  return filter as DeadLetterFilter;
}

async function readJson(req: IncomingMessage): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).byteLength;
    if (size > MAX_BODY_BYTES) throw new ValidationError(`the request body is over ${MAX_BODY_BYTES} bytes`, [{ path: 'body', message: 'too large' }]);
    chunks.push(chunk as Buffer);
  }
  const text = Buffer.concat(chunks).toString('utf8');
  let value: unknown;
  try {
    value = text === '' ? {} : JSON.parse(text);
  } catch {
    throw new ValidationError('the request body is not JSON', [{ path: 'body', message: 'not JSON' }]);
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new ValidationError('the request body must be a JSON object', [{ path: 'body', message: 'not an object' }]);
  return value as Record<string, unknown>;
}

/** Answers one API request (already authenticated); `path` is below `/api/`. */
export async function answerApi(mailroom: Mailroom, readOnly: boolean, method: string, path: string, query: URLSearchParams, req: IncomingMessage): Promise<ApiAnswer> {
  try {
    if (method === 'GET') {
      if (path === 'meta') return ok({ readOnly, schema: mailroom.schema, database: mailroom.databaseKind });
      if (path === 'stats') return ok(await mailroom.stats());
      const job = /^jobs\/([^/]+)$/.exec(path);
      if (job) {
        const info = await mailroom.jobs.get(decodeURIComponent(job[1]!));
        return info ? ok(info) : fail(404, `no job with id ${decodeURIComponent(job[1]!)}`);
      }
      const correlation = /^correlation\/([^/]+)$/.exec(path);
      if (correlation) return ok(await mailroom.jobs.byCorrelation(decodeURIComponent(correlation[1]!)));
      if (path === 'dead-letters') {
        const limit = query.get('limit');
        return ok(await mailroom.deadLetters.list(filterFrom(Object.fromEntries(query)), { limit: limit === null ? undefined : Number(limit), cursor: query.get('cursor') }));
      }
      const letter = /^dead-letters\/([^/]+)$/.exec(path);
      if (letter) {
        const detail = await mailroom.deadLetters.show(decodeURIComponent(letter[1]!));
        return detail ? ok(detail) : fail(404, `no dead letter with id ${decodeURIComponent(letter[1]!)}`);
      }
      return fail(404, `no such API: GET /api/${path}`);
    }
    if (method === 'POST' && (path === 'dead-letters/replay' || path === 'dead-letters/discard')) {
      if (readOnly) return fail(403, 'this dashboard is read-only: replay and discard are turned off');
      const body = await readJson(req);
      const filter = filterFrom(typeof body.filter === 'object' && body.filter !== null ? (body.filter as Record<string, unknown>) : {});
      const dryRun = body.dryRun === true;
      const by = 'dashboard';
      if (path === 'dead-letters/replay') {
        const ratePerSecond = body.ratePerSecond === undefined || body.ratePerSecond === null || body.ratePerSecond === '' ? undefined : Number(body.ratePerSecond);
        return ok(await mailroom.deadLetters.replay(filter, { dryRun, ratePerSecond, by }));
      }
      return ok(await mailroom.deadLetters.discard(filter, { dryRun, by }));
    }
    return fail(405, `no such API: ${method} /api/${path}`);
  } catch (error) {
    if (error instanceof ValidationError) return fail(400, error.message);
    if (error instanceof MailroomError) return fail(500, error.message);
    throw error;
  }
}
