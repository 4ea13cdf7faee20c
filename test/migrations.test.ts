/**
 * Migrations: idempotent, safe when several instances and processes run them
 * at once, produce exactly the committed schema dump (sql/schema.sql) on
 * PostgreSQL and PGlite, can be run by hand from migrationSql(), and refuse a
 * database migrated by a newer mailroom.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, test } from 'node:test';
import { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { createMailroom, MailroomError, migrations, migrationSql, type Mailroom } from '../src/index.ts';
import { openPglite } from '../src/storage/pglite-open.ts';
import { databaseUrl, testDatabases, uniqueSchema, type TestDatabase } from './helpers/databases.ts';
import { dumpSchema, lineDiff, readCommittedDump, SCHEMA_DUMP_PATH, writeCommittedDump, type CatalogReader } from './helpers/schema-dump.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const VERSIONS = migrations().map((m) => m.version);
const UPDATE = process.env.UPDATE_SCHEMA_DUMP === '1';

async function sqlRows<R>(db: CatalogReader, text: string, params: unknown[] = []): Promise<R[]> {
  return (await db.query(text, params)).rows as R[];
}

/** One statement on a PGlite instance or a pg pool (the two query() signatures do not unify). */
function query(db: PGlite | pg.Pool, text: string, params?: unknown[]): Promise<{ rows: unknown[] }> {
  return (db as CatalogReader).query(text, params);
}

async function appliedVersions(db: CatalogReader, schema: string): Promise<number[]> {
  const rows = await sqlRows<{ version: number }>(db, `SELECT version FROM "${schema}".migrations ORDER BY version`);
  return rows.map((r) => r.version);
}

/** Runs a multi-statement script: PGlite's exec, or node-postgres' simple query protocol. */
async function runScript(db: PGlite | pg.Pool | pg.Client, script: string): Promise<void> {
  if (db instanceof PGlite) await db.exec(script);
  else await db.query(script);
}

/** Fails with a readable diff when `actual` is not the committed dump. */
function assertMatchesCommitted(actual: string, where: string): void {
  const committed = readCommittedDump();
  if (committed === undefined) assert.fail(`${SCHEMA_DUMP_PATH} is missing; run \`npm run schema:dump\` to create it`);
  if (committed !== actual) {
    assert.fail(
      `sql/schema.sql no longer matches what the migrations create on ${where}.\n` +
        'If the change is intended, rewrite it with `npm run schema:dump` (or UPDATE_SCHEMA_DUMP=1) and commit it.\n' +
        `Diff (- committed, + migrations):\n${lineDiff(committed, actual)}`,
    );
  }
}

/** A schema made outside db.open(), dropped at the end of the test. */
async function withFreshSchema(db: TestDatabase, fn: (schema: string, handle: PGlite | pg.Pool) => Promise<void>): Promise<void> {
  const handle = await db.handle();
  const schema = uniqueSchema('mig');
  try {
    await fn(schema, handle);
  } finally {
    await query(handle, `DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  }
}

for (const db of testDatabases()) {
  describe(`migrations on ${db.name}`, () => {
    test('migrate() is idempotent: a second and third run apply nothing and change nothing', async () => {
      const { mailroom, schema } = await db.open();
      const handle = await db.handle();
      const before = await dumpSchema(handle, schema);
      assert.deepEqual(await mailroom.migrate(), { applied: [] });
      assert.deepEqual(await mailroom.migrate(), { applied: [] });
      assert.deepEqual(await appliedVersions(handle, schema), VERSIONS);
      assert.equal(await dumpSchema(handle, schema), before);
    });

    test('several instances migrating one new schema at once all succeed and apply each migration once', async () => {
      await withFreshSchema(db, async (schema, handle) => {
        const instances: Mailroom[] = [];
        try {
          for (let i = 0; i < 5; i++) {
            // On PostgreSQL each instance has its own pool, so the migrations really run side by side.
            const database = db.name === 'postgres' ? databaseUrl! : handle;
            instances.push(await createMailroom({ database, schema, poolSize: 2 }));
          }
          const results = await Promise.all(instances.map((m) => m.migrate()));
          const applied = results.flatMap((r) => r.applied).sort((a, b) => a - b);
          assert.deepEqual(applied, VERSIONS, `each migration applied exactly once in all; got ${JSON.stringify(results)}`);
          assert.equal(results.filter((r) => r.applied.length > 0).length, 1, 'one instance applied them, the others found nothing to do');
          assert.deepEqual(await appliedVersions(handle, schema), VERSIONS);
          assertMatchesCommitted(await dumpSchema(handle, schema), `${db.name} (concurrent migrate)`);
        } finally {
          await Promise.all(instances.map((m) => m.close()));
        }
      });
    });

    if (db.name === 'postgres') {
      test('several processes started at once migrate one new schema: all succeed, each migration applied once', { timeout: 120_000 }, async () => {
        await withFreshSchema(db, async (schema, handle) => {
          const children = Array.from({ length: 4 }, () =>
            spawn(process.execPath, ['--import', 'tsx', 'test/fixtures/migrate-once.ts', databaseUrl!, schema], {
              cwd: ROOT,
              stdio: ['pipe', 'pipe', 'pipe'],
            }),
          );
          const outputs = children.map((child) => {
            let stdout = '';
            let stderr = '';
            let onReady: () => void = () => {};
            const ready = new Promise<void>((resolve) => (onReady = resolve));
            child.stdout.setEncoding('utf8').on('data', (chunk: string) => {
              stdout += chunk;
              if (stdout.includes('ready\n')) onReady();
            });
            child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
            const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
            // A child that dies before it is ready must not hang the barrier.
            void exited.then(() => onReady());
            return { ready, exited, stdout: () => stdout, stderr: () => stderr };
          });
          try {
            await Promise.all(outputs.map((o) => o.ready));
            for (const child of children) child.stdin.end('go\n'); // all start migrating together
            const codes = await Promise.all(outputs.map((o) => o.exited));
            const results = outputs.map((o, i) => {
              const line = o.stdout().split('\n').find((l) => l.startsWith('{'));
              assert.ok(line, `child ${i} printed no result (exit ${codes[i]}); stderr:\n${o.stderr()}`);
              return JSON.parse(line) as { ok: boolean; applied?: number[]; error?: string };
            });
            for (const [i, r] of results.entries()) assert.ok(r.ok, `child ${i} failed: ${r.error}; stderr:\n${outputs[i]!.stderr()}`);
            assert.deepEqual(codes, children.map(() => 0));
            const applied = results.flatMap((r) => r.applied ?? []).sort((a, b) => a - b);
            assert.deepEqual(applied, VERSIONS, `each migration applied exactly once across processes; got ${JSON.stringify(results)}`);
            assert.deepEqual(await appliedVersions(handle, schema), VERSIONS);
            assertMatchesCommitted(await dumpSchema(handle, schema), 'postgres (concurrent processes)');
          } finally {
            for (const child of children) if (child.exitCode === null) child.kill('SIGKILL');
          }
        });
      });
    }

    test('a freshly migrated schema matches the committed dump sql/schema.sql', async () => {
      const { schema } = await db.open();
      const dump = await dumpSchema(await db.handle(), schema);
      if (UPDATE && readCommittedDump() !== dump) {
        writeCommittedDump(dump);
        console.log(`rewrote ${SCHEMA_DUMP_PATH} from ${db.name}`);
      }
      assertMatchesCommitted(dump, db.name);
    });

    test('migrationSql() run by hand on a fresh schema gives the same schema as migrate(), and migrate() then has nothing to do', async () => {
      const { schema: migrated } = await db.open();
      const handle = await db.handle();
      const expected = await dumpSchema(handle, migrated);
      await withFreshSchema(db, async (schema) => {
        for (const m of migrations()) await runScript(handle, migrationSql(m, schema));
        const dump = await dumpSchema(handle, schema);
        assert.equal(lineDiff(expected, dump), '', 'hand-run migrationSql() differs from migrate()');
        const mailroom = await createMailroom({ database: handle, schema });
        try {
          assert.deepEqual(await mailroom.migrate(), { applied: [] });
        } finally {
          await mailroom.close();
        }
      });
    });

    test('migrationSql() for the default schema "mailroom" runs by hand on a fresh database', async (t) => {
      const { schema: migrated } = await db.open();
      const expected = await dumpSchema(await db.handle(), migrated, { withoutBookkeeping: true });
      const script = migrations().map((m) => migrationSql(m, 'mailroom')).join('\n');
      assert.match(script, /CREATE TABLE "mailroom"\.jobs/);
      if (db.name === 'pglite') {
        const { db: fresh } = await openPglite();
        try {
          await runScript(fresh, script);
          assert.equal(lineDiff(expected, await dumpSchema(fresh, 'mailroom', { withoutBookkeeping: true })), '');
        } finally {
          await fresh.close();
        }
        return;
      }
      // PostgreSQL: the shared test database may have a "mailroom" schema already, so use a new database.
      const admin = await db.handle();
      const database = `mailroom_sqltest_${process.pid}_${Date.now().toString(36)}`;
      try {
        await query(admin, `CREATE DATABASE ${database}`);
      } catch (error) {
        t.skip(`cannot create a database to test in (${(error as Error).message})`);
        return;
      }
      try {
        const url = new URL(databaseUrl!);
        url.pathname = `/${database}`;
        const client = new pg.Client({ connectionString: url.toString() });
        await client.connect();
        try {
          await runScript(client, script);
          assert.equal(lineDiff(expected, await dumpSchema(client, 'mailroom', { withoutBookkeeping: true })), '');
        } finally {
          await client.end();
        }
      } finally {
        await query(admin, `DROP DATABASE IF EXISTS ${database}`);
      }
    });

    if (db.name === 'postgres') {
      test('the migration files run with psql -v schema=... as their header says', async (t) => {
        if (spawnSync('psql', ['--version']).status !== 0) {
          t.skip('psql is not installed');
          return;
        }
        const { schema: migrated } = await db.open();
        const handle = await db.handle();
        const expected = await dumpSchema(handle, migrated, { withoutBookkeeping: true });
        await withFreshSchema(db, async (schema) => {
          await query(handle, `CREATE SCHEMA "${schema}"`);
          for (const m of migrations()) {
            const file = `sql/migrations/${String(m.version).padStart(4, '0')}_${m.name}.sql`;
            const run = spawnSync('psql', [databaseUrl!, '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-v', `schema=${schema}`, '-f', file], { cwd: ROOT, encoding: 'utf8' });
            assert.equal(run.status, 0, `psql -f ${file} failed:\n${run.stderr}`);
          }
          assert.equal(lineDiff(expected, await dumpSchema(handle, schema, { withoutBookkeeping: true })), '');
        });
      });
    }

    test('a database migrated by a newer mailroom is refused with a clear error, and left as it was', async () => {
      const { mailroom, schema } = await db.open();
      const handle = await db.handle();
      const newest = VERSIONS.at(-1)!;
      const future = newest + 9000;
      await query(handle, `INSERT INTO "${schema}".migrations (version, name) VALUES ($1, 'from_the_future')`, [future]);
      const before = await dumpSchema(handle, schema);
      await assert.rejects(mailroom.migrate(), (error: Error) => {
        assert.ok(error instanceof MailroomError, `expected a MailroomError, got ${error.name}: ${error.message}`);
        assert.match(error.message, new RegExp(`\\b${future}\\b`), 'names the unknown version');
        assert.match(error.message, new RegExp(`\\b${newest}\\b`), 'names the newest version this code knows');
        assert.match(error.message, /newer/);
        assert.match(error.message, /upgrade mailroom/, 'says how to fix it');
        return true;
      });
      // A fresh instance (as a restarted process would) is refused the same way.
      const other = await createMailroom({ database: handle, schema });
      try {
        await assert.rejects(other.migrate(), MailroomError);
      } finally {
        await other.close();
      }
      assert.deepEqual(await appliedVersions(handle, schema), [...VERSIONS, future]);
      assert.equal(await dumpSchema(handle, schema), before);
    });
  });
}

test('the dump names the schema only through the placeholder', async () => {
  const committed = readCommittedDump();
  assert.ok(committed, `${SCHEMA_DUMP_PATH} is missing; run \`npm run schema:dump\``);
  const body = committed.split('\n').filter((line) => !line.startsWith('-- ') || line.startsWith('-- (made by')).join('\n');
  assert.doesNotMatch(body, /\b(t|mig)_\d+_|\bmailroom\./, 'no test schema name or "mailroom." left in the dump');
  assert.match(committed, /CREATE TABLE :"schema"\.jobs \(/);
});
