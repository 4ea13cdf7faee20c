/**
 * The guard of the relay's own batches: no key per event, two keys per outbox
 * and stream whatever the rate.
 *
 * Every event the relay reads has a mark: its (xid, position), the order in
 * which the relay reads the outbox, as 40 digits. The relay hands a target
 * batches that start where everything before was delivered (the cursor, or
 * the end of the batch before, which must then have been added first), and
 * sends each batch sorted by position, so a batch's marks are not in order.
 * So the guard keeps, per origin (the outbox) and stream:
 * - `done`: every event with a mark up to it was added (raised to a batch's
 *   highest mark when the batch's last call has added all of it);
 * - the marks added above `done`, one string of 40-digit marks appended to by
 *   each call (one `APPEND` per call; a sorted set with a member per event
 *   cost Redis about 1.7 µs more per event): deleted after every whole
 *   batch, so it holds at most the batches in flight;
 * - which attempt (one `publish` call) wrote last, and whether marks of an
 *   earlier attempt were kept when this one began (`stale`): only then are
 *   the kept marks read, into a Lua table, and events looked up in it one by
 *   one; the calls of one attempt add distinct events, and a call whose
 *   previous call added the event before it finds that event's mark at the
 *   string's end.
 * A retried batch (after a failed call, a lost reply, a crash before the
 * cursor moved, another relay taking over) skips every event up to `done`
 * and every one kept, whatever its new composition.
 */
import { createHash } from 'node:crypto';
import { ENTRY_LUA, slotBase } from './add-script.ts';

/** A mark's length: (xid, position), 20 digits each. */
const MARK_LENGTH = 40;

/**
 * Adds a call's share of a batch, in order, each event unless an earlier call
 * added it.
 *
 * KEYS[1] the stream; KEYS[2] the guard's state (a hash: done, attempt,
 * stale); KEYS[3] the marks added above `done` (a string of 40-digit marks).
 * ARGV[1] the attempt; ARGV[2] the batch's highest mark when this is the
 * batch's last call, else ''; ARGV[3] the mark of the event before this call
 * ('' for none: the call then needs nothing before it); ARGV[4] MAXLEN ('' for
 * none); ARGV[5] the content type of every event; then per event its mark and
 * the arguments of `eventArguments`.
 * Returns how many events were added. Refuses (`MAILROOM_ORDER`) when the
 * event before the call was not added; stops at the first failed XADD, keeping
 * the marks of what it added before it.
 */
export const MARK_SCRIPT = `
local attempt, batchEnd, before, maxlen, contentType = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local state = redis.call('HMGET', KEYS[2], 'done', 'attempt', 'stale')
local done, stale = state[1] or '', tonumber(state[3] or '0')
if state[2] ~= attempt then stale = redis.call('STRLEN', KEYS[3]) end
local function keptMarks()
  local list, marks = redis.call('GET', KEYS[3]) or '', {}
  for i = 1, #list, ${MARK_LENGTH} do marks[#marks + 1] = string.sub(list, i, i + ${MARK_LENGTH - 1}) end
  return marks
end
local seen = nil
if stale > 0 then
  seen = {}
  for _, mark in ipairs(keptMarks()) do seen[mark] = true end
end
if before ~= '' and before > done and not (seen and seen[before]) and redis.call('GETRANGE', KEYS[3], -${MARK_LENGTH}, -1) ~= before then
  return redis.error_reply('MAILROOM_ORDER the event before this run was not added; the batch is retried as a whole')
end
${ENTRY_LUA}
local marks, n, failure = {}, 0, nil
local a = 6
while a <= #ARGV do
  local mark = ARGV[a]
  local count, after = entry(a + 1, contentType)
  if not (mark <= done or (seen and seen[mark])) then
    local r = xadd(KEYS[1], maxlen, count)
    if type(r) == 'table' and r.err then
      failure = r.err
      break
    end
    n = n + 1
    marks[n] = mark
  end
  a = after
end
if n > 0 then redis.call('APPEND', KEYS[3], table.concat(marks)) end
if failure == nil and batchEnd ~= '' then
  if batchEnd > done then done = batchEnd end
  if stale > 0 then
    local keep = {}
    for _, mark in ipairs(keptMarks()) do
      if mark > done then keep[#keep + 1] = mark end
    end
    if #keep > 0 then redis.call('SET', KEYS[3], table.concat(keep)) else redis.call('DEL', KEYS[3]) end
    stale = #keep * ${MARK_LENGTH}
  else
    redis.call('DEL', KEYS[3])
  end
  redis.call('HSET', KEYS[2], 'done', done, 'attempt', attempt, 'stale', stale)
else
  redis.call('HSET', KEYS[2], 'attempt', attempt, 'stale', stale)
end
if failure then return redis.error_reply(failure) end
return n
`;

/** The script's SHA1, as `EVALSHA` wants it. */
export const MARK_SCRIPT_SHA = createHash('sha1').update(MARK_SCRIPT).digest('hex');

/**
 * An event's mark: its xid and position, 20 digits each, so that comparing
 * marks as text compares (xid, position).
 *
 * @example
 * markOf({ xid: '812', position: '42' }) // '0000000000000000081200000000000000000042'
 */
export function markOf(row: { xid: string; position: string }): string {
  return row.xid.padStart(20, '0') + row.position.padStart(20, '0');
}

/**
 * The guard's two keys for an origin (the outbox) and a stream, in the
 * stream's hash slot: its state, and the marks kept above `done`.
 *
 * @example
 * guardKeys('orders', '7715011348433492106:16384:16790')
 * // ['{orders}:mailroom:relayed:7715011348433492106:16384:16790', '{orders}:mailroom:relayed:7715011348433492106:16384:16790:marks']
 */
export function guardKeys(stream: string, origin: string): [state: string, marks: string] {
  const state = `${slotBase(stream)}:mailroom:relayed:${origin}`;
  return [state, `${state}:marks`];
}
