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
 * - the marks added above `done`, in a sorted set: empty again after every
 *   whole batch, so it holds at most the batches in flight;
 * - which attempt (one `publish` call) wrote last, and whether the set held
 *   marks of an earlier attempt when this one began (`stale`): only then are
 *   events looked up in the set one by one; the calls of one attempt add
 *   distinct events.
 * A retried batch (after a failed call, a lost reply, a crash before the
 * cursor moved, another relay taking over) skips every event up to `done`
 * and every one in the set, whatever its new composition.
 */
import { createHash } from 'node:crypto';
import { ENTRY_LUA, slotBase } from './add-script.ts';

/**
 * Adds a call's share of a batch, in order, each event unless an earlier call
 * added it.
 *
 * KEYS[1] the stream; KEYS[2] the guard's state (a hash: done, attempt,
 * stale); KEYS[3] the marks added above `done` (a sorted set, all scores 0,
 * ordered by the marks' bytes).
 * ARGV[1] the attempt; ARGV[2] the batch's highest mark when this is the
 * batch's last call, else ''; ARGV[3] the mark of the event before this call
 * ('' for none: the call then needs nothing before it); ARGV[4] MAXLEN ('' for
 * none); ARGV[5] the content type of every event; then per event its mark and
 * the arguments of `eventArguments`.
 * Returns how many events were added. Refuses (`MAILROOM_ORDER`) when the
 * event before the call was not added; stops at the first failed XADD, keeping
 * what it added before it in the set.
 */
export const MARK_SCRIPT = `
local attempt, batchEnd, before, maxlen, contentType = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local state = redis.call('HMGET', KEYS[2], 'done', 'attempt', 'stale')
local done, stale = state[1] or '', tonumber(state[3] or '0')
if state[2] ~= attempt then stale = redis.call('ZCARD', KEYS[3]) end
if before ~= '' and before > done and not redis.call('ZSCORE', KEYS[3], before) then
  return redis.error_reply('MAILROOM_ORDER the event before this run was not added; the batch is retried as a whole')
end
${ENTRY_LUA}
local marks, n, failure = {}, 0, nil
local a = 6
while a <= #ARGV do
  local mark = ARGV[a]
  local fields, after = entry(a + 1, contentType)
  if not (mark <= done or (stale > 0 and redis.call('ZSCORE', KEYS[3], mark))) then
    local r = xadd(KEYS[1], maxlen, fields)
    if type(r) == 'table' and r.err then
      failure = r.err
      break
    end
    marks[n + 1] = 0
    marks[n + 2] = mark
    n = n + 2
  end
  a = after
end
if n > 0 then redis.call('ZADD', KEYS[3], unpack(marks)) end
if failure == nil and batchEnd ~= '' then
  if batchEnd > done then done = batchEnd end
  redis.call('ZREMRANGEBYLEX', KEYS[3], '-', '[' .. done)
  stale = redis.call('ZCARD', KEYS[3])
  redis.call('HSET', KEYS[2], 'done', done, 'attempt', attempt, 'stale', stale)
else
  redis.call('HSET', KEYS[2], 'attempt', attempt, 'stale', stale)
end
if failure then return redis.error_reply(failure) end
return n / 2
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
 * stream's hash slot.
 *
 * @example
 * guardKeys('orders', '7715011348433492106:16384:16790')
 * // ['{orders}:mailroom:relayed:7715011348433492106:16384:16790', '{orders}:mailroom:relayed:7715011348433492106:16384:16790:added']
 */
export function guardKeys(stream: string, origin: string): [state: string, added: string] {
  const state = `${slotBase(stream)}:mailroom:relayed:${origin}`;
  return [state, `${state}:added`];
}
