/**
 * The Lua script that adds one event to a stream unless its id was added
 * within the dedup window, and the keys it touches. Streams have no dedup of
 * their own: a `SET NX PX` on a key named after the event id is the guard.
 */
import { createHash } from 'node:crypto';
import { hashTag } from './options.ts';

/**
 * KEYS[1] the stream; KEYS[2] this event's dedup key; KEYS[3] (optional) the
 * dedup key of the event before it in the same batch.
 * ARGV[1] the dedup window (ms); ARGV[2] MAXLEN ('' for none); ARGV[3..] the entry's fields and values.
 * Returns the new entry's id, or 0 when the event was already added.
 *
 * A batch is one pipeline of these calls. If one fails, the ones after it must
 * not be added (the retried batch would add the failed one behind them, out of
 * order), so each refuses when the event before it left no dedup key. When the
 * XADD fails after the SET, the SET is undone, so a retry adds the event.
 */
export const ADD_SCRIPT = `
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 0 then
  return redis.error_reply('MAILROOM_ORDER the event before this one in the batch was not added; the batch is retried as a whole')
end
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then
  return 0
end
local added
if ARGV[2] == '' then
  added = redis.pcall('XADD', KEYS[1], '*', unpack(ARGV, 3))
else
  added = redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))
end
if type(added) == 'table' and added.err then
  redis.call('DEL', KEYS[2])
end
return added
`;

/** The script's SHA1, as `EVALSHA` wants it. */
export const ADD_SCRIPT_SHA = createHash('sha1').update(ADD_SCRIPT).digest('hex');

/**
 * The key that remembers an event id for a stream. It shares the stream's hash
 * slot: the stream's own hash tag when it has one, else the stream name as the tag.
 *
 * @example
 * dedupKey('orders', '0190…') // '{orders}:mailroom:dedup:0190…'
 */
export function dedupKey(stream: string, eventId: string): string {
  const base = hashTag(stream) === null ? `{${stream}}` : stream;
  return `${base}:mailroom:dedup:${eventId}`;
}
