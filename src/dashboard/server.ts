/**
 * The dashboard: one page and its JSON API on Node's http. Every API request
 * must carry the token (`Authorization: Bearer …`, never a cookie, so another
 * site cannot make a browser send it); actions must also come from the
 * dashboard's own origin, as JSON, and are refused in read-only mode.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Mailroom } from '../mailroom.ts';
import { answerApi } from './api.ts';
import { resolveDashboardOptions, type DashboardOptions } from './options.ts';
import { DASHBOARD_PAGE } from './page.ts';

/** A dashboard made by {@link createDashboard}. */
export interface Dashboard {
  /** The request handler (mount it on your own server, or call `listen`). */
  handle(req: IncomingMessage, res: ServerResponse): void;
  /** Serves it; resolves with the address to open (carrying the token when it was generated). */
  listen(port?: number, host?: string): Promise<{ url: string; close(): Promise<void> }>;
  /** Whether replay and discard are turned off. */
  readonly readOnly: boolean;
}

const SECURITY_HEADERS = {
  'x-content-type-options': 'nosniff',
  'x-frame-options': 'DENY',
  'referrer-policy': 'no-referrer',
  'cache-control': 'no-store',
};

const digest = (text: string): Buffer => createHash('sha256').update(text).digest();

function send(res: ServerResponse, status: number, contentType: string, body: string, extra: Record<string, string> = {}): void {
  res.writeHead(status, { ...SECURITY_HEADERS, 'content-type': contentType, 'content-length': Buffer.byteLength(body), ...extra });
  res.end(body);
}

const sendJson = (res: ServerResponse, status: number, body: unknown): void => send(res, status, 'application/json; charset=utf-8', JSON.stringify(body));

/** True when a browser says the request comes from another site (Origin or Sec-Fetch-Site). */
function crossSite(req: IncomingMessage): boolean {
  const site = req.headers['sec-fetch-site'];
  if (site !== undefined && site !== 'same-origin' && site !== 'none') return true;
  const origin = req.headers.origin;
  if (origin === undefined) return false;
  try {
    return new URL(origin).host !== req.headers.host;
  } catch {
    return true;
  }
}

/**
 * The web dashboard for operators: queues (depth, oldest age, rates), relay
 * and consumer lag, a job's history by id or correlation id, and the
 * dead-letter queue with filters, a rate-limited replay and discard.
 *
 * @example
 * const dashboard = createDashboard(mailroom, { token: process.env.MAILROOM_DASHBOARD_TOKEN });
 * const { url } = await dashboard.listen(4000, '127.0.0.1');
 */
export function createDashboard(mailroom: Mailroom, options: DashboardOptions = {}): Dashboard {
  const settings = resolveDashboardOptions(options);
  const expected = digest(settings.token);
  const authorized = (req: IncomingMessage): boolean => {
    const header = req.headers.authorization;
    if (typeof header !== 'string' || !header.startsWith('Bearer ')) return false;
    return timingSafeEqual(digest(header.slice('Bearer '.length).trim()), expected);
  };

  const handle = (req: IncomingMessage, res: ServerResponse): void => {
    const url = new URL(req.url ?? '/', 'http://dashboard');
    const method = req.method ?? 'GET';
    if (url.pathname === '/' && (method === 'GET' || method === 'HEAD')) {
      // The page holds no data: it asks for the token and reads everything through the API. Its one
      // script runs by a nonce made for this response; no other script can.
      const nonce = randomBytes(16).toString('base64');
      return send(res, 200, 'text/html; charset=utf-8', DASHBOARD_PAGE.replace('<script>', `<script nonce="${nonce}">`), {
        'content-security-policy': `default-src 'none'; script-src 'nonce-${nonce}'; style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'`,
      });
    }
    if (!url.pathname.startsWith('/api/')) return sendJson(res, 404, { error: `no such page: ${url.pathname}` });
    if (!authorized(req)) return sendJson(res, 401, { error: 'a valid token is required: send Authorization: Bearer <token>' });
    if (method !== 'GET') {
      if (crossSite(req)) return sendJson(res, 403, { error: 'actions must come from the dashboard itself (cross-site request refused)' });
      if (!String(req.headers['content-type'] ?? '').startsWith('application/json')) return sendJson(res, 415, { error: 'actions take a JSON body (content-type: application/json)' });
    }
    answerApi(mailroom, settings.readOnly, method, url.pathname.slice('/api/'.length), url.searchParams, req).then(
      (answer) => sendJson(res, answer.status, answer.body),
      (error: unknown) => sendJson(res, 500, { error: error instanceof Error ? error.message : String(error) }),
    );
  };

  return {
    handle,
    readOnly: settings.readOnly,
    async listen(port = 0, host = '127.0.0.1') {
      const server: Server = createServer(handle);
      await new Promise<void>((resolve, reject) => {
        server.once('error', (error: NodeJS.ErrnoException) =>
          reject(error.code === 'EADDRINUSE' ? new Error(`port ${port} on ${host} is taken; pick another port (0 picks a free one)`, { cause: error }) : error),
        );
        server.listen(port, host, () => resolve());
      });
      const address = server.address() as AddressInfo;
      const shown = address.family === 'IPv6' ? `[${address.address}]` : address.address;
      const base = `http://${shown}:${address.port}/`;
      return {
        url: settings.generatedToken ? `${base}#token=${settings.token}` : base,
        close: () =>
          new Promise<void>((resolve) => {
            server.close(() => resolve());
            server.closeAllConnections();
          }),
      };
    },
  };
}
