/**
 * The Lua script that adds one event to a stream unless its id was added
 * within the dedup window, and the keys it touches. Streams have no dedup of
 * their own: a `SET NX PX` on a key named after the event id is the guard.
 */
import { createHash } from 'node:crypto';
import { hashTag } from './options.ts';

/**
 * Adds a run of events of one batch, in order, each unless its id was added
 * within the dedup window.
 *
 * KEYS[1] the stream; KEYS[2] the dedup key of the event before this run
 * (when ARGV[1] is '1'); then one dedup key per event.
 * ARGV[1] '1' when KEYS[2] is the previous run's last key, else '0';
 * ARGV[2] the dedup window (ms); ARGV[3] MAXLEN ('' for none); then per event
 * the number of its field/value arguments and those arguments.
 * Returns how many events were added (the others were already there).
 *
 * A batch is one pipeline of runs. If one fails, the ones after it must not be
 * added (the retried batch would add the failed one behind them, out of
 * order): a run refuses when the event before it left no dedup key, and a run
 * stops at its first failed XADD, whose dedup key it deletes so a retry adds it.
 */
export const ADD_SCRIPT = `
local first = 2
if ARGV[1] == '1' then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    return redis.error_reply('MAILROOM_ORDER the event before this run was not added; the batch is retried as a whole')
  end
  first = 3
end
local window, maxlen = ARGV[2], ARGV[3]
local a, added = 4, 0
for k = first, #KEYS do
  local n = tonumber(ARGV[a])
  if redis.call('SET', KEYS[k], '1', 'NX', 'PX', window) then
    local r
    if maxlen == '' then
      r = redis.pcall('XADD', KEYS[1], '*', unpack(ARGV, a + 1, a + n))
    else
      r = redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', unpack(ARGV, a + 1, a + n))
    end
    if type(r) == 'table' and r.err then
      redis.call('DEL', KEYS[k])
      return redis.error_reply(r.err)
    end
    added = added + 1
  end
  a = a + n + 1
end
return added
`;

/** Events per script call: long enough to spread the call's cost, short enough not to stall Redis. */
export const EVENTS_PER_CALL = 100;

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
