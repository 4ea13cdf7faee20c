/**
 * Stream replies (read as buffers, RESP2 shapes) turned into entries, and
 * entries into the messages a source delivers.
 */

/** One stream entry; `fields` is null when the entry was deleted or trimmed while pending. */
export interface StreamEntry {
  readonly id: string;
  readonly fields: readonly Buffer[] | null;
}

function text(value: unknown): string {
  if (Buffer.isBuffer(value)) return value.toString('utf8');
  if (typeof value === 'string' || typeof value === 'number') return String(value);
  throw new TypeError(`redis: unexpected reply element ${JSON.stringify(value)}`);
}

function buffer(value: unknown): Buffer {
  if (Buffer.isBuffer(value)) return value;
  if (typeof value === 'string' || typeof value === 'number') return Buffer.from(String(value), 'utf8');
  throw new TypeError(`redis: unexpected reply element ${JSON.stringify(value)}`);
}

/**
 * `[[id, [field, value, …] | null], …]` as entries.
 *
 * @example
 * parseEntryList([[Buffer.from('1-0'), [Buffer.from('id'), Buffer.from('e1')]]]) // [{ id: '1-0', fields: [<id>, <e1>] }]
 */
export function parseEntryList(reply: unknown): StreamEntry[] {
  if (reply === null || reply === undefined) return [];
  if (!Array.isArray(reply)) throw new TypeError('redis: a stream reply was not a list of entries');
  return reply.flatMap((item: unknown): StreamEntry[] => {
    if (item === null) return []; // Redis 6.2 XAUTOCLAIM: a deleted entry
    if (!Array.isArray(item)) throw new TypeError('redis: a stream entry was not [id, fields]');
    const [id, fields] = item as [unknown, unknown];
    return [{ id: text(id), fields: Array.isArray(fields) ? fields.map(buffer) : null }];
  });
}

/**
 * `XREADGROUP … STREAMS <one stream> <id>`: `null` or `[[stream, entries]]`.
 *
 * @example
 * parseReadReply(await client.callBuffer('XREADGROUP', ['GROUP', 'g', 'c', 'STREAMS', 'orders', '>']))
 */
export function parseReadReply(reply: unknown): StreamEntry[] {
  if (reply === null || reply === undefined) return [];
  if (!Array.isArray(reply)) throw new TypeError('redis: an XREADGROUP reply was not a list');
  return reply.flatMap((perStream: unknown) => {
    if (!Array.isArray(perStream)) throw new TypeError('redis: an XREADGROUP reply was not [stream, entries]');
    return parseEntryList(perStream[1]);
  });
}

/**
 * `XAUTOCLAIM`: `[next cursor, entries, deleted ids]` (the third part since Redis 7).
 *
 * @example
 * const { cursor, entries, deleted } = parseAutoclaimReply(await client.callBuffer('XAUTOCLAIM', ['orders', 'g', 'c', 60000, '0-0']));
 */
export function parseAutoclaimReply(reply: unknown): { cursor: string; entries: StreamEntry[]; deleted: string[] } {
  if (!Array.isArray(reply) || reply.length < 2) throw new TypeError('redis: an XAUTOCLAIM reply was not [cursor, entries, deleted]');
  const deleted = Array.isArray(reply[2]) ? (reply[2] as unknown[]).map(text) : [];
  return { cursor: text(reply[0]), entries: parseEntryList(reply[1]), deleted };
}

/**
 * An entry's fields as a source message's parts: `body` (bytes; empty when the
 * entry has none), every other field as a header (lower-case name, UTF-8
 * value), and the `id` field as the message id.
 *
 * @example
 * entryParts([Buffer.from('id'), Buffer.from('e1'), Buffer.from('body'), Buffer.from('{}')]) // { body: <{}>, headers: { id: 'e1' }, messageId: 'e1' }
 */
export function entryParts(fields: readonly Buffer[]): { body: Buffer; headers: Record<string, string>; messageId: string | null } {
  let body: Buffer = Buffer.alloc(0);
  const headers: Record<string, string> = {};
  for (let i = 0; i + 1 < fields.length; i += 2) {
    const name = fields[i]!.toString('utf8').toLowerCase();
    const value = fields[i + 1]!;
    if (name === 'body') body = value;
    else headers[name] = value.toString('utf8');
  }
  return { body, headers, messageId: headers.id ?? null };
}
