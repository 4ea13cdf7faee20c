/**
 * Holding back a response while its handler writes it: status, headers and
 * body are kept (headers stay on the response), nothing reaches the client
 * until `send` or `sendRecorded`, and writes after that are dropped.
 */
import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import type { RecordedResponse } from './store.ts';

/** Headers that describe one connection or one sending, not the response: never recorded. */
const NOT_RECORDED = new Set(['connection', 'keep-alive', 'transfer-encoding', 'content-length', 'date', 'upgrade', 'trailer']);

type Chunk = string | Uint8Array;
type Callback = (error?: Error | null) => void;

export interface HeldResponse {
  /** Resolves with the response once the handler ended it. */
  readonly ended: Promise<RecordedResponse>;
  /** Sends what the handler wrote (its headers are already on the response). */
  sendHeld(response: RecordedResponse): void;
  /** Sends a response that the handler did not write (a replay, or an error of the middleware). */
  sendOther(response: RecordedResponse, extraHeaders?: Record<string, string>): void;
}

function bufferOf(chunk: Chunk, encoding?: BufferEncoding): Buffer {
  return typeof chunk === 'string' ? Buffer.from(chunk, encoding ?? 'utf8') : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
}

function recordable(headers: OutgoingHttpHeaders): Record<string, string | string[]> {
  const kept: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || NOT_RECORDED.has(name)) continue;
    kept[name] = Array.isArray(value) ? value.map(String) : String(value);
  }
  return kept;
}

/** Takes over the response's writeHead, write and end until it is sent. */
export function holdResponse(res: ServerResponse): HeldResponse {
  const realWriteHead = res.writeHead.bind(res);
  const realEnd = res.end.bind(res) as (body?: Buffer) => ServerResponse;
  const chunks: Buffer[] = [];
  let sent = false;
  let resolveEnded!: (response: RecordedResponse) => void;
  const ended = new Promise<RecordedResponse>((resolve) => (resolveEnded = resolve));

  const writeHead = (status: number, reasonOrHeaders?: string | OutgoingHttpHeaders, maybeHeaders?: OutgoingHttpHeaders): ServerResponse => {
    if (sent) return res;
    res.statusCode = status;
    const headers = typeof reasonOrHeaders === 'object' ? reasonOrHeaders : maybeHeaders;
    if (headers && !Array.isArray(headers)) for (const [name, value] of Object.entries(headers)) if (value !== undefined) res.setHeader(name, value);
    return res;
  };
  const write = (chunk: Chunk, encodingOrCallback?: BufferEncoding | Callback, callback?: Callback): boolean => {
    const encoding = typeof encodingOrCallback === 'string' ? encodingOrCallback : undefined;
    const done = typeof encodingOrCallback === 'function' ? encodingOrCallback : callback;
    if (!sent) chunks.push(bufferOf(chunk, encoding));
    done?.(null);
    return true;
  };
  const end = (chunkOrCallback?: Chunk | Callback, encodingOrCallback?: BufferEncoding | Callback, callback?: Callback): ServerResponse => {
    if (typeof chunkOrCallback === 'function') callback = chunkOrCallback;
    else if (chunkOrCallback !== undefined && chunkOrCallback !== null) chunks.push(bufferOf(chunkOrCallback, typeof encodingOrCallback === 'string' ? encodingOrCallback : undefined));
    if (typeof encodingOrCallback === 'function') callback = encodingOrCallback;
    if (!sent) resolveEnded({ status: res.statusCode, headers: recordable(res.getHeaders()), body: Buffer.concat(chunks) });
    callback?.();
    return res;
  };
  Object.assign(res, { writeHead, write, end });

  const finish = (body: Buffer): void => {
    sent = true;
    res.setHeader('content-length', body.byteLength);
    realWriteHead(res.statusCode);
    realEnd(body);
  };
  return {
    ended,
    sendHeld: (response) => finish(response.body),
    sendOther(response, extraHeaders = {}) {
      for (const name of res.getHeaderNames()) res.removeHeader(name);
      for (const [name, value] of Object.entries({ ...response.headers, ...extraHeaders })) res.setHeader(name, value);
      res.statusCode = response.status;
      finish(response.body);
    },
  };
}
