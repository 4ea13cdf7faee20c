/**
 * Housekeeping for a Redis consumer group: every source with a default
 * consumer name adds a consumer to the group, and Redis keeps them forever.
 * Consumers holding no pending entries that have not read for a while are
 * removed. One script, so no read can slip in between the look and the
 * removal (a consumer removed while it reads would drop what it just read
 * from the pending list); a live consumer that is removed comes back on its
 * next read.
 */
import type { Redis } from 'ioredis';

const FORGET_SCRIPT = `
local removed = 0
for _, consumer in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local info = {}
  for i = 1, #consumer, 2 do info[consumer[i]] = consumer[i + 1] end
  if info['name'] ~= ARGV[2] and info['pending'] == 0 and info['idle'] > tonumber(ARGV[3]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    removed = removed + 1
  end
end
return removed
`;

/**
 * Removes the group's consumers (other than `self`) with no pending entries that have been idle longer than `idleMs`; returns how many.
 *
 * @example
 * await forgetIdleConsumers(client, 'orders', 'billing', 'web-1:42:ab12cd34', 120_000) // 2
 */
export async function forgetIdleConsumers(client: Redis, stream: string, group: string, self: string, idleMs: number): Promise<number> {
  return Number(await client.call('EVAL', [FORGET_SCRIPT, 1, stream, group, self, idleMs]));
}
