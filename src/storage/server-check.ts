/**
 * Checks the server's settings that stop mailroom as a whole: with
 * `synchronous_standby_names` set and fewer synchronous standbys connected
 * than it asks for, every transaction that writes waits at its COMMIT until
 * enough connect, so enqueues, claims, completions and the relay hang. Used by
 * `mailroom doctor`.
 */
import type { SafetyWarning } from '../brokers/safety.ts';
import type { ReadQuery } from './schema-check.ts';

const SETTINGS_SQL = `SELECT current_setting('synchronous_standby_names') AS names,
       current_setting('synchronous_commit') AS commit,
       (SELECT count(*)::int FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')) AS connected,
       (SELECT count(*)::int FROM pg_stat_replication WHERE sync_state IS NULL) AS hidden`;

/** Commit levels that wait for a synchronous standby. */
const WAITING_LEVELS = new Set(['on', 'remote_write', 'remote_apply']);

/** How many synchronous standbys `synchronous_standby_names` asks for: `FIRST 2 (a, b)`, `ANY 2 (…)`, `2 (…)`, else 1. */
export function standbysRequired(names: string): number {
  const counted = /^\s*(?:(?:FIRST|ANY)\s+)?(\d+)\s*\(/i.exec(names);
  return counted ? Number(counted[1]) : 1;
}

/**
 * Warnings about the server `query` reads: `sync-standby-missing` when its
 * commits wait for synchronous standbys that are not connected. Read-only.
 *
 * @example
 * const warnings = await checkServer((sql, params) => pool.query(sql, params).then((r) => r.rows), 'postgres://db/app');
 */
export async function checkServer(query: ReadQuery, where: string): Promise<SafetyWarning[]> {
  const [row] = await query<{ names: string; commit: string; connected: number; hidden: number }>(SETTINGS_SQL);
  if (!row || row.names.trim() === '' || !WAITING_LEVELS.has(row.commit)) return [];
  // A role without pg_read_all_stats sees no sync_state: then nothing can be told.
  if (row.hidden > 0) return [];
  const required = standbysRequired(row.names);
  if (row.connected >= required) return [];
  return [
    {
      subject: `server ${where}`,
      code: 'sync-standby-missing',
      message:
        `synchronous_standby_names is '${row.names}' (${required} synchronous standby${required === 1 ? '' : 's'}) and synchronous_commit is ${row.commit}, ` +
        `but ${row.connected} synchronous standby${row.connected === 1 ? ' is' : 's are'} connected (pg_stat_replication): every transaction that writes waits at its COMMIT ` +
        'until enough connect, so enqueues, claims, completions and the relay hang. Bring the standby back, or clear the setting to commit on this server alone ' +
        "(ALTER SYSTEM SET synchronous_standby_names = ''; SELECT pg_reload_conf();). A stop cancels such a COMMIT: it is then committed on this server only.",
    },
  ];
}
