/**
 * The HTTP endpoint of `mailroom start` (node:http, no framework):
 * `GET <path>` (default /metrics) serves mailroom's Prometheus text, and
 * `GET /healthz` says whether the process is running (200 `ok`) or starting
 * / stopping (503), for load balancers and orchestrators.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** Where the endpoint listens. */
export interface MetricsEndpoint {
  host: string;
  port: number;
  path: string;
}

/** What the metrics page shows: `mailroom.metrics()` and its content type. */
export interface MetricsSource {
  metrics(): string | Promise<string>;
  readonly metricsContentType: string;
}

/** The phase `/healthz` reports: 503 while `starting` or `stopping`, 200 while `running`. */
export type Health = 'starting' | 'running' | 'stopping';

/** A listening endpoint. */
export interface MetricsServer {
  /** The metrics page's URL (with the port actually bound, e.g. after `port: 0`). */
  readonly url: string;
  readonly port: number;
  /** Serves this source on the metrics path (until then the page answers 503). */
  setSource(source: MetricsSource): void;
  setHealth(health: Health): void;
  /** Stops listening and drops open connections. */
  close(): Promise<void>;
}

function send(res: ServerResponse, status: number, body: string, contentType = 'text/plain; charset=utf-8'): void {
  res.writeHead(status, { 'content-type': contentType, 'cache-control': 'no-store' });
  res.end(body);
}

/** Why a listen failed, and what to do about it. */
function listenError(error: NodeJS.ErrnoException, endpoint: MetricsEndpoint): Error {
  const where = `${endpoint.host}:${endpoint.port}`;
  const fix = 'pick another port with --port PORT (or metrics.port in the config), or turn the endpoint off with --no-metrics';
  if (error.code === 'EADDRINUSE') return new Error(`cannot serve metrics on ${where}: port ${endpoint.port} is in use (another mailroom start, or another exporter?); ${fix}`, { cause: error });
  if (error.code === 'EACCES') return new Error(`cannot serve metrics on ${where}: not allowed to listen on port ${endpoint.port} (ports below 1024 need privileges); ${fix}`, { cause: error });
  if (error.code === 'EADDRNOTAVAIL' || error.code === 'ENOTFOUND') {
    return new Error(`cannot serve metrics on ${where}: ${endpoint.host} is not an address of this machine; set metrics.host to '127.0.0.1' or '0.0.0.0'`, { cause: error });
  }
  return new Error(`cannot serve metrics on ${where}: ${error.message}; ${fix}`, { cause: error });
}

/**
 * Starts listening on `endpoint`; rejects with an error naming the port and
 * the fix when it cannot (port in use, no permission).
 *
 * @example
 * const server = await startMetricsServer({ host: '127.0.0.1', port: 9464, path: '/metrics' });
 * server.setSource(mailroom); server.setHealth('running');
 */
export async function startMetricsServer(endpoint: MetricsEndpoint): Promise<MetricsServer> {
  let source: MetricsSource | undefined;
  let health: Health = 'starting';
  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const path = new URL(req.url ?? '/', 'http://localhost').pathname;
    if (path !== endpoint.path && path !== '/healthz') return send(res, 404, `not found; try ${endpoint.path} or /healthz\n`);
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.setHeader('allow', 'GET, HEAD');
      return send(res, 405, 'only GET and HEAD\n');
    }
    if (path === '/healthz') return send(res, health === 'running' ? 200 : 503, `${health === 'running' ? 'ok' : health}\n`);
    if (!source) return send(res, 503, 'starting\n');
    try {
      const body = await source.metrics();
      send(res, 200, body, source.metricsContentType);
    } catch (error) {
      send(res, 500, `mailroom could not read its metrics: ${error instanceof Error ? error.message : String(error)}\n`);
    }
  };
  const server = createServer((req, res) => {
    handle(req, res).catch(() => {
      if (!res.headersSent) send(res, 500, 'internal error\n');
      else res.destroy();
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', (error: NodeJS.ErrnoException) => reject(listenError(error, endpoint)));
    server.listen(endpoint.port, endpoint.host, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  const host = endpoint.host.includes(':') ? `[${endpoint.host}]` : endpoint.host;
  return {
    url: `http://${host}:${port}${endpoint.path}`,
    port,
    setSource: (s) => (source = s),
    setHealth: (h) => (health = h),
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
