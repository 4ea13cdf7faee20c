/**
 * The Idempotency-Key middleware for Node's http, Connect and Express: a
 * request that carries a key runs once per key; its handler's database work
 * (through `idempotencyTx(req)`), its jobs and events commit with the
 * recorded response, and a repeat gets that response again.
 */
import { createHash } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duration } from '../duration.ts';
import { toMilliseconds } from '../duration.ts';
import { MailroomError, ValidationError } from '../errors.ts';
import type { Mailroom, MailroomTransaction } from '../mailroom.ts';
import { holdResponse } from './capture.ts';
import { IdempotencyStore, type RecordedResponse } from './store.ts';
import { parseIdempotencyKey } from './key.ts';

/** A request as the middleware reads it: Node's, with what Express adds when it is there. */
export type IdempotentRequest = IncomingMessage & { originalUrl?: string; body?: unknown };

/** Options of {@link idempotency}. */
export interface IdempotencyOptions {
  /** The methods whose requests a key protects. Default `['POST', 'PATCH']`. */
  methods?: string[];
  /** Answer 400 to a request of those methods without a key. Default false: it runs as usual, unprotected. */
  required?: boolean;
  /** Whose keys these are: a key is unique within its scope (e.g. the authenticated account). Default one scope. */
  scope?: (req: IdempotentRequest) => string;
  /**
   * What makes two requests the same: a key reused for a different one is
   * answered 422. Default: the method, the URL and the parsed body
   * (`req.body`, so mount the middleware after your body parser).
   */
  fingerprint?: (req: IdempotentRequest) => string;
  /** How long a key's response is kept and replayed. Default `'24h'`; at least `'1s'`. */
  retention?: Duration;
  /** How long a handler may keep the key's transaction open; past it the work rolls back and the answer is 503. Default `'30s'`. */
  timeout?: Duration;
}

/** The middleware, with the store's upkeep. */
export interface IdempotencyMiddleware {
  (req: IncomingMessage, res: ServerResponse, next: (error?: unknown) => void): void;
  /** Deletes keys older than the retention (also done in the background at most every ten minutes); how many. */
  prune(): Promise<number>;
}

const transactions = new WeakMap<IncomingMessage, MailroomTransaction>();
const PRUNE_EVERY_MS = 10 * 60_000;

/**
 * The transaction of a request running under the Idempotency-Key
 * middleware: do the handler's database work, enqueues and publishes
 * through it, and they commit with the recorded response (or not at all).
 *
 * @example
 * app.post('/orders', idempotent, async (req, res) => {
 *   const tx = idempotencyTx(req);
 *   await tx.query('INSERT INTO orders (id) VALUES ($1)', [req.body.id]);
 *   await mailroom.publish(orderPlaced, { id: req.body.id }, { tx });
 *   res.status(201).json({ id: req.body.id });
 * });
 */
export function idempotencyTx(req: IncomingMessage): MailroomTransaction {
  const tx = transactions.get(req);
  if (!tx) {
    throw new MailroomError(
      'idempotencyTx: this request has no idempotency transaction. Mount idempotency(mailroom) before the handler; a request without an Idempotency-Key (when not required) or of another method runs without one.',
    );
  }
  return tx;
}

function problem(status: number, title: string, detail: string): RecordedResponse {
  return { status, headers: { 'content-type': 'application/problem+json' }, body: Buffer.from(JSON.stringify({ type: 'about:blank', title, status, detail })) };
}

function defaultFingerprint(req: IdempotentRequest): string {
  const body = req.body;
  const text = body === undefined || body === null ? '' : typeof body === 'string' ? body : Buffer.isBuffer(body) ? body.toString('base64') : JSON.stringify(body);
  return `${req.method ?? ''} ${req.originalUrl ?? req.url ?? ''}\n${text}`;
}

function resolveOptions(options: IdempotencyOptions) {
  const invalid = (path: string, message: string) => new ValidationError(`idempotency: ${message}`, [{ path, message }]);
  if (typeof options !== 'object' || options === null) throw invalid('options', 'options must be an object');
  const methods = options.methods ?? ['POST', 'PATCH'];
  if (!Array.isArray(methods) || methods.length === 0 || methods.some((m) => typeof m !== 'string' || !/^[A-Za-z]+$/.test(m))) {
    throw invalid('methods', `methods must be a non-empty list of HTTP methods such as ['POST'], got ${JSON.stringify(options.methods)}`);
  }
  for (const name of ['scope', 'fingerprint'] as const) {
    if (options[name] !== undefined && typeof options[name] !== 'function') throw invalid(name, `${name} must be a function of the request, got ${typeof options[name]}`);
  }
  if (options.required !== undefined && typeof options.required !== 'boolean') throw invalid('required', `required must be true or false, got ${JSON.stringify(options.required)}`);
  const duration = (value: Duration | undefined, fallback: string, path: string, min: number): number => {
    let ms: number;
    try {
      ms = toMilliseconds(value ?? fallback, `idempotency ${path}`);
    } catch {
      throw invalid(path, `${path} must be a duration (milliseconds, or a string like '24h'), got ${JSON.stringify(value)}`);
    }
    if (ms < min) throw invalid(path, `${path} must be at least ${min} ms, got ${ms} ms`);
    return ms;
  };
  return {
    methods: new Set(methods.map((m) => m.toUpperCase())),
    required: options.required === true,
    scope: options.scope ?? (() => ''),
    fingerprint: options.fingerprint ?? defaultFingerprint,
    retentionMs: duration(options.retention, '24h', 'retention', 1000),
    timeoutMs: duration(options.timeout, '30s', 'timeout', 1),
  };
}

/**
 * Middleware (Node's http, Connect, Express) for the `Idempotency-Key`
 * request header: the first request with a key runs, in a transaction that
 * records its response; a repeat with the same key and request gets that
 * response again (`Idempotent-Replayed: true`) without running the handler.
 * The same key while its first request runs: 409. The same key for another
 * request: 422. A 5xx answer rolls its work back and records nothing.
 *
 * @example
 * import { idempotency, idempotencyTx } from 'mailroom/http';
 * const idempotent = idempotency(mailroom, { scope: (req) => req.headers['x-account'] as string });
 * app.post('/orders', express.json(), idempotent, createOrder);
 */
export function idempotency(mailroom: Mailroom, options: IdempotencyOptions = {}): IdempotencyMiddleware {
  const settings = resolveOptions(options);
  const store = new IdempotencyStore(mailroom, settings.retentionMs);
  let lastPrune = Date.now();
  /** The store failed (the database): to `mailroom.on('error')`, or the console when nobody listens. */
  const report = (error: unknown): void => {
    if (mailroom.listenerCount('error') > 0) mailroom.emit('error', { origin: { component: 'http' }, error });
    else console.error('[mailroom] http idempotency:', error instanceof Error ? error.message : String(error));
  };

  const middleware = (req: IncomingMessage, res: ServerResponse, next: (error?: unknown) => void): void => {
    if (!settings.methods.has((req.method ?? '').toUpperCase())) return next();
    // headersDistinct keeps a repeated header apart (req.headers joins the values with ', ').
    const distinct = req.headersDistinct?.['idempotency-key'];
    const header = distinct && distinct.length > 1 ? distinct : req.headers['idempotency-key'];
    if (header === undefined) {
      if (!settings.required) return next();
      return holdResponse(res).sendOther(problem(400, 'Idempotency-Key required', `A ${req.method} request here must carry an Idempotency-Key header (a unique string per operation, e.g. a UUID).`));
    }
    const key = parseIdempotencyKey(header);
    if (typeof key !== 'string') return holdResponse(res).sendOther(problem(400, 'Bad Idempotency-Key', key.problem));
    let scope: string;
    let fingerprint: string;
    try {
      scope = settings.scope(req as IdempotentRequest);
      if (typeof scope !== 'string') throw new ValidationError(`idempotency: scope(req) must return a string, got ${typeof scope}`, [{ path: 'scope', message: 'not a string' }]);
      fingerprint = createHash('sha256').update(settings.fingerprint(req as IdempotentRequest)).digest('base64url');
    } catch (error) {
      return next(error);
    }
    const held = holdResponse(res);
    const run = store.run(scope, key, fingerprint, async (tx) => {
      transactions.set(req, tx);
      let timer: NodeJS.Timeout | undefined;
      const timedOut = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new HandlerTimeout(settings.timeoutMs)), settings.timeoutMs);
      });
      try {
        next();
        return await Promise.race([held.ended, timedOut]);
      } finally {
        clearTimeout(timer);
        transactions.delete(req);
      }
    });
    run.then(
      (outcome) => {
        switch (outcome.kind) {
          case 'recorded':
          case 'rolled-back':
            held.sendHeld(outcome.response);
            break;
          case 'replayed':
            held.sendOther(outcome.response, { 'idempotent-replayed': 'true' });
            break;
          case 'in-progress':
            held.sendOther(problem(409, 'Request in progress', 'A request with this Idempotency-Key is still running; retry later for its response.'), { 'retry-after': '1' });
            break;
          case 'mismatch':
            held.sendOther(problem(422, 'Idempotency-Key reused', 'This Idempotency-Key was used for a different request (method, URL or body); use a new key for a new operation.'));
            break;
        }
        if (outcome.kind === 'recorded' && Date.now() - lastPrune > PRUNE_EVERY_MS) {
          lastPrune = Date.now();
          void store.prune().catch(report);
        }
      },
      (error: unknown) => {
        if (error instanceof HandlerTimeout) {
          held.sendOther(problem(503, 'Request timed out', `The request took longer than ${settings.timeoutMs} ms; its work was rolled back and nothing was recorded, so retrying with the same key runs it again.`), { 'retry-after': '1' });
        } else {
          held.sendOther(problem(503, 'Idempotency store unavailable', 'The request could not be recorded and its work was rolled back; retry with the same key.'), { 'retry-after': '1' });
          report(error);
        }
      },
    );
  };
  return Object.assign(middleware, { prune: () => store.prune() });
}

class HandlerTimeout extends Error {
  constructor(ms: number) {
    super(`the handler did not answer within ${ms} ms`);
    this.name = 'HandlerTimeout';
  }
}
