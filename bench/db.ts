/** PostgreSQL administration for the benchmark: one fresh database per system and workload. */
import pg from 'pg';

/** Replaces the database name of a postgres:// URL. */
export function withDatabase(serverUrl: string, database: string): string {
  const url = new URL(serverUrl);
  url.pathname = `/${database}`;
  return url.toString();
}

/** Database names are made here from fixed parts and a tag of [a-z0-9_]: checked anyway. */
function checkName(name: string): string {
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(name)) throw new Error(`invalid database name ${JSON.stringify(name)}`);
  return name;
}

async function withAdmin<T>(serverUrl: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: withDatabase(serverUrl, 'postgres') });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/** Creates an empty database; returns its URL. */
export async function createDatabase(serverUrl: string, name: string): Promise<string> {
  checkName(name);
  await withAdmin(serverUrl, async (c) => {
    await c.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`);
    await c.query(`CREATE DATABASE "${name}"`);
  });
  return withDatabase(serverUrl, name);
}

/** Drops a database, ending any session still connected to it. */
export async function dropDatabase(serverUrl: string, name: string): Promise<void> {
  checkName(name);
  await withAdmin(serverUrl, (c) => c.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`));
}

/** Drops the databases whose names start with `prefix` (this run's, after an interruption). */
export async function dropLeftovers(serverUrl: string, prefix: string): Promise<string[]> {
  return withAdmin(serverUrl, async (c) => {
    const { rows } = await c.query<{ datname: string }>(`SELECT datname FROM pg_database WHERE datname LIKE $1`, [`${prefix}%`]);
    for (const r of rows) await c.query(`DROP DATABASE IF EXISTS "${checkName(r.datname)}" WITH (FORCE)`);
    return rows.map((r) => r.datname);
  });
}

export interface ServerInfo {
  version: string;
  settings: Record<string, string>;
}

const SETTINGS = [
  'synchronous_commit',
  'fsync',
  'full_page_writes',
  'wal_sync_method',
  'commit_delay',
  'shared_buffers',
  'work_mem',
  'max_wal_size',
  'checkpoint_timeout',
  'autovacuum',
  'max_connections',
];

/** The server version and the settings that matter for a queue's write path. */
export async function serverInfo(serverUrl: string): Promise<ServerInfo> {
  return withAdmin(serverUrl, async (c) => {
    const { rows: v } = await c.query<{ server_version: string }>('SHOW server_version');
    const { rows } = await c.query<{ name: string; setting: string }>(
      `SELECT name, current_setting(name) AS setting FROM pg_settings WHERE name = ANY($1::text[]) ORDER BY name`,
      [SETTINGS],
    );
    return { version: v[0]?.server_version ?? 'unknown', settings: Object.fromEntries(rows.map((r) => [r.name, r.setting])) };
  });
}

/**
 * `--autovacuum`: turns the server's autovacuum on for the run (ALTER SYSTEM and
 * a reload; PostgreSQL's default is on) when it is off, and returns how to put
 * the setting back. Needs a superuser.
 */
export async function enableAutovacuum(serverUrl: string): Promise<(() => Promise<void>) | undefined> {
  return withAdmin(serverUrl, async (c) => {
    const { rows } = await c.query<{ on: boolean }>(`SELECT current_setting('autovacuum')::boolean AS on`);
    if (rows[0]?.on) return undefined;
    await c.query('ALTER SYSTEM SET autovacuum = on');
    await c.query('SELECT pg_reload_conf()');
    return () =>
      withAdmin(serverUrl, async (admin) => {
        await admin.query('ALTER SYSTEM RESET autovacuum');
        await admin.query('SELECT pg_reload_conf()');
      });
  });
}
