/**
 * The Lua script that adds one event to a stream unless its id was added
 * within the dedup window, and the keys it touches. Streams have no dedup of
 * their own: a `SET NX PX` on a key named after the event id is the guard.
 * The relay's own batches use the guard of mark-script.ts, which keeps no key
 * per event; this one serves events published without the relay's origin
 * (`parkedEvents.republish`, a publish by hand, a database that does not say
 * which it is).
 */
import { createHash } from 'node:crypto';
import { TRANSPORT_HEADERS, type WireText } from '../wire.ts';
import { hashTag } from './options.ts';

/**
 * Lua shared by the add scripts: `entry(a, contentType)` writes the fields of
 * the entry of the event whose arguments start at ARGV[a] (its shape, see
 * {@link eventArguments}) into the script's one `fields` table and returns
 * their count and the index after them; `xadd(stream, maxlen, n)` adds the
 * first n of them (maxlen '' for none) and returns the reply or the error.
 * The table is filled again for each event, not made anew.
 */
export const ENTRY_LUA = `local headers = {${TRANSPORT_HEADERS.map((name) => `'${name}'`).join(', ')}}
local fields = {}
local function entry(a, contentType)
  local shape = tonumber(ARGV[a])
  fields[1], fields[2], fields[3], fields[4] = 'id', ARGV[a + 1], 'type', ARGV[a + 2]
  local n, v = 4, a + 3
  if bit.band(shape, 1) ~= 0 then
    fields[5], fields[6] = 'key', ARGV[v]
    n, v = 6, v + 1
  end
  fields[n + 1], fields[n + 2] = 'content-type', contentType
  n = n + 2
  for h = 1, 4 do
    if bit.band(shape, 2 ^ h) ~= 0 then
      fields[n + 1], fields[n + 2] = headers[h], ARGV[v]
      n, v = n + 2, v + 1
    end
  end
  fields[n + 1], fields[n + 2] = 'body', ARGV[v]
  return n + 2, v + 1
end
local function xadd(stream, maxlen, n)
  if maxlen == '' then return redis.pcall('XADD', stream, '*', unpack(fields, 1, n)) end
  return redis.pcall('XADD', stream, 'MAXLEN', '~', maxlen, '*', unpack(fields, 1, n))
end`;

/**
 * Adds a run of events of one batch, in order, each unless its id was added
 * within the dedup window.
 *
 * KEYS[1] the stream; KEYS[2] the dedup key of the event before this run
 * (when ARGV[1] is '1'); then one dedup key per event.
 * ARGV[1] '1' when KEYS[2] is the previous run's last key, else '0';
 * ARGV[2] the dedup window (ms); ARGV[3] MAXLEN ('' for none); ARGV[4] the
 * content type of every event; then per event its shape (see
 * {@link eventArguments}), its id, its type, the values the shape names, and
 * its body. The script names the fields: the entry is id, type, key (when
 * there is one), content-type, the transport headers the event has (in the
 * order of `TRANSPORT_HEADERS`), body. Sending values only, not name/value
 * pairs, took about 40 % off the client's CPU for each event.
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
local window, maxlen, contentType = ARGV[2], ARGV[3], ARGV[4]
${ENTRY_LUA}
local a, added = 5, 0
for k = first, #KEYS do
  local count, after = entry(a, contentType)
  if redis.call('SET', KEYS[k], '1', 'NX', 'PX', window) then
    local r = xadd(KEYS[1], maxlen, count)
    if type(r) == 'table' and r.err then
      redis.call('DEL', KEYS[k])
      return redis.error_reply(r.err)
    end
    added = added + 1
  end
  a = after
end
return added
`;

/** The transport headers an entry may carry, in the script's order, each with its bit in a shape (2, 4, 8, 16). */
const SHAPE_HEADERS = TRANSPORT_HEADERS.map((name, i) => [name, 2 << i] as const);

/**
 * Appends one event's arguments for {@link ADD_SCRIPT} to `args`: its shape
 * (bit 1: a key follows; bits 2, 4, 8, 16: traceparent, correlationid,
 * causationid, partitionkey follow), id, type, those values, body.
 *
 * @example
 * eventArguments(args, wireTextOf(event)) // args gains e.g. 17, id, type, key, partitionkey, body
 */
export function eventArguments(args: (string | number)[], message: WireText): void {
  let shape = message.key === null ? 0 : 1;
  for (const [name, bit] of SHAPE_HEADERS) if (message.headers[name] !== undefined) shape |= bit;
  args.push(shape, message.id, message.type);
  if (message.key !== null) args.push(message.key);
  for (const [name] of SHAPE_HEADERS) {
    const value = message.headers[name];
    if (value !== undefined) args.push(value);
  }
  args.push(message.body);
}

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
  return `${slotBase(stream)}:mailroom:dedup:${eventId}`;
}

/**
 * The prefix of mailroom's keys for a stream, in the stream's hash slot: the
 * stream itself when it has a hash tag, else the stream name as the tag.
 *
 * @example
 * slotBase('orders') // '{orders}'
 * slotBase('events:{orders}') // 'events:{orders}'
 */
export function slotBase(stream: string): string {
  return hashTag(stream) === null ? `{${stream}}` : stream;
}
