/**
 * Redis settings that break a guarantee of the target or the source: no
 * persistence, eviction, a dedup window shorter than the relay's republish
 * horizon, and CONFIG not being readable at all (managed Redis).
 */
import type { Redis } from 'ioredis';
import type { SafetyWarning } from '../safety.ts';
import { reason } from './connection.ts';
import { redactUrl } from './options.ts';

/**
 * `redis <url> stream <stream>`: the subject of a warning (password redacted).
 *
 * @example
 * warningSubject('redis://:pw@cache:6379', 'orders') // 'redis redis://:***@cache:6379 stream orders'
 */
export function warningSubject(url: string, stream: string): string {
  return `redis ${redactUrl(url)} stream ${stream}`;
}

function pairs(reply: unknown): Map<string, string> {
  const map = new Map<string, string>();
  if (Array.isArray(reply)) {
    for (let i = 0; i + 1 < reply.length; i += 2) map.set(String(reply[i]), String(reply[i + 1]));
  }
  return map;
}

async function readConfig(client: Redis): Promise<Map<string, string>> {
  const config = new Map<string, string>();
  // One parameter per CONFIG GET: Redis before 7 takes only one.
  for (const name of ['save', 'appendonly', 'maxmemory', 'maxmemory-policy']) {
    for (const [key, value] of pairs(await client.call('CONFIG', ['GET', name]))) config.set(key, value);
  }
  return config;
}

/**
 * The server's persistence and eviction settings, as warnings for a target
 * (`role: 'target'`) or a source. When CONFIG cannot be read (not allowed by
 * the ACL, renamed by a managed service), one `redis-config-unreadable` warning.
 *
 * @example
 * for (const w of await serverWarnings(client, warningSubject(url, 'orders'), 'target')) console.warn(w.code, w.message);
 */
export async function serverWarnings(client: Redis, subject: string, role: 'target' | 'source'): Promise<SafetyWarning[]> {
  let config: Map<string, string>;
  try {
    config = await readConfig(client);
  } catch (err) {
    return [
      {
        subject,
        code: 'redis-config-unreadable',
        message:
          `could not read the server's settings (CONFIG GET failed: ${reason(err)}), so mailroom cannot tell whether ` +
          'Redis keeps the stream on disk or may evict it. Check with your provider that persistence (AOF) is on and ' +
          "maxmemory-policy is 'noeviction', or allow the CONFIG command for this user (ACL: +config|get).",
      },
    ];
  }
  const warnings: SafetyWarning[] = [];
  const save = (config.get('save') ?? '').trim();
  const appendonly = (config.get('appendonly') ?? '').trim().toLowerCase();
  if (save === '' && appendonly === 'no') {
    warnings.push({
      subject,
      code: 'redis-no-persistence',
      message:
        (role === 'target'
          ? 'the server keeps nothing on disk (save is empty and appendonly is no): a restart loses every event in the stream, ' +
            'including events the relay has already published and will not publish again, and the consumer groups with their pending entries. '
          : 'the server keeps nothing on disk (save is empty and appendonly is no): a restart loses the stream, the group and its pending entries, ' +
            'so events not yet stored by mailroom are gone. ') +
        "Turn on the append-only file: CONFIG SET appendonly yes, with appendfsync always (or everysec, which can lose the last second on a crash), and set it in redis.conf too.",
    });
  }
  const maxmemory = Number(config.get('maxmemory') ?? '0');
  const policy = (config.get('maxmemory-policy') ?? 'noeviction').trim().toLowerCase();
  if (maxmemory > 0 && policy !== 'noeviction') {
    const what = policy.startsWith('volatile')
      ? 'keys with an expiry, such as the dedup keys of published events, so a republished event can get through twice'
      : role === 'target'
        ? 'any key, the stream included: published events can vanish before a consumer group reads them'
        : 'any key, the stream included: entries and the pending entries of the group can vanish before mailroom stores them';
    warnings.push({
      subject,
      code: 'redis-eviction',
      message:
        `maxmemory is ${maxmemory} bytes with maxmemory-policy ${policy}: when memory runs out Redis evicts ${what}. ` +
        "Set maxmemory-policy to 'noeviction' (a full server then refuses writes, and the relay retries), or keep the stream on a Redis without eviction.",
    });
  }
  return warnings;
}

/**
 * `redis-dedup-window`: the target forgets event ids sooner than the relay may republish one.
 *
 * @example
 * dedupWindowWarning(subject, 600_000, 3_600_000) // [{ code: 'redis-dedup-window', … }]
 */
export function dedupWindowWarning(subject: string, dedupWindowMs: number, republishHorizonMs: number): SafetyWarning[] {
  if (dedupWindowMs >= republishHorizonMs) return [];
  return [
    {
      subject,
      code: 'redis-dedup-window',
      message:
        `dedupWindow is ${dedupWindowMs} ms but the relay can publish an event again up to ${republishHorizonMs} ms later ` +
        '(a relay that crashed after Redis replied and before its cursor committed). The relay\'s batches are recognised by their place in the outbox ' +
        'whatever the window, but where the database does not say which outbox it is (pg_control_system() not allowed) they fall back to the event id, ' +
        `and such a duplicate would be added to the stream again. Set dedupWindow to at least ${republishHorizonMs} ms ` +
        '(consumers still deduplicate on the event id, so this costs duplicates, not correctness).',
    },
  ];
}

/**
 * A warning when the relay's database does not say which outbox it is: the
 * relay's batches are then guarded by a dedup key per event, kept for
 * `dedupWindow`, instead of by their place in the outbox.
 *
 * @example
 * guardByIdWarning(subject, null, 86_400_000) // [{ code: 'redis-guard-by-id', … }]
 */
export function guardByIdWarning(subject: string, origin: string | null | undefined, dedupWindowMs: number): SafetyWarning[] {
  if (origin !== null) return [];
  return [
    {
      subject,
      code: 'redis-guard-by-id',
      message:
        "the relay's database role may not call pg_control_system(), so the relay cannot say which outbox its batches come from: " +
        `each relayed event leaves a dedup key in Redis for dedupWindow (${dedupWindowMs} ms; about 150 bytes each, 1.3 GB a day at 100 events a second). ` +
        "Let the role call it (GRANT EXECUTE ON FUNCTION pg_control_system() TO <role>), or shorten dedupWindow to what your Redis's memory allows.",
    },
  ];
}
