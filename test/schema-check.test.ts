/**
 * `mailroom doctor`'s schema check (src/storage/schema-check.ts): an installed schema against the
 * committed dump. A dropped index, an invalid one, a schema behind the migrations and one with no
 * tables are each reported with the statement that fixes it; a sound schema gives nothing.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { checkSchema, expectedIndexes } from '../src/storage/schema-check.ts';
import { checkServer } from '../src/storage/server-check.ts';
import { databaseUrl, testDatabases, uniqueSchema, type TestMailroom } from './helpers/databases.ts';
import { runMailroom } from './helpers/cli.ts';

const reader = (t: TestMailroom) => <R>(sql: string, params?: unknown[]) => t.sql<R>(sql, params);

for (const db of testDatabases()) {
  describe(`schema check on ${db.name}`, () => {
    it('a sound schema has nothing to report; a dropped index or primary key is reported with the statement that makes it again', async () => {
      const t = await db.open();
      assert.deepEqual(await checkSchema(reader(t), t.schema, 'the test database'), []);
      await t.sql(`DROP INDEX "${t.schema}".jobs_ordering_holder_idx`);
      await t.sql(`ALTER TABLE "${t.schema}".wake_listeners DROP CONSTRAINT wake_listeners_pkey`);
      const warnings = await checkSchema(reader(t), t.schema, 'the test database');
      assert.deepEqual(warnings.map((w) => w.code), ['index-missing', 'index-missing']);
      const holder = warnings.find((w) => /jobs_ordering_holder_idx/.test(w.message))!;
      assert.equal(holder.subject, `schema "${t.schema}" on the test database`);
      assert.match(holder.message, new RegExp(`^index jobs_ordering_holder_idx on jobs is missing, so the statements it serves read the whole table\\. Make it again: CREATE INDEX CONCURRENTLY jobs_ordering_holder_idx ON "${t.schema}"\\.jobs USING btree \\(queue, ordering_key\\) WHERE`));
      const pkey = warnings.find((w) => /wake_listeners_pkey/.test(w.message))!;
      assert.match(pkey.message, new RegExp(`Make it again: ALTER TABLE "${t.schema}"\\.wake_listeners ADD CONSTRAINT wake_listeners_pkey PRIMARY KEY \\(channel, listener\\);$`));
      // The statements given are the fix.
      const concurrently = (w: { message: string }) => w.message.slice(w.message.indexOf('Make it again: ') + 15).replace(' CONCURRENTLY', '');
      for (const w of warnings) await t.sql(concurrently(w));
      assert.deepEqual(await checkSchema(reader(t), t.schema, 'the test database'), []);
    });

    it('a server without synchronous standbys to wait for has nothing to report', async () => {
      const t = await db.open();
      assert.deepEqual(await checkServer(reader(t), 'the test database'), []);
    });

    it('a schema behind the migrations, and one with no mailroom tables, say to migrate', async () => {
      const t = await db.open();
      await t.sql(`DELETE FROM "${t.schema}".migrations WHERE version = (SELECT max(version) FROM "${t.schema}".migrations)`);
      const behind = await checkSchema(reader(t), t.schema, 'db');
      assert.deepEqual(behind.map((w) => w.code), ['schema-behind']);
      assert.match(behind[0]!.message, /^the schema is at migration \d+ and this version of mailroom needs \d+: run `mailroom migrate --schema /);
      const empty = uniqueSchema('empty');
      const missing = await checkSchema(reader(t), empty, 'db');
      assert.deepEqual(missing.map((w) => w.code), ['schema-missing']);
    });
  });
}

describe('mailroom doctor --database', () => {
  it('reports an invalid index and a missing one (exit 1, JSON with each code), and nothing on a sound schema (exit 0)', { skip: databaseUrl ? false : 'TEST_DATABASE_URL is not set' }, async () => {
    const [postgres] = testDatabases().filter((d) => d.name === 'postgres');
    const t = await postgres!.open();
    const args = ['doctor', '--database', databaseUrl!, '--schema', t.schema];
    const sound = await runMailroom(args);
    assert.equal(sound.code, 0, sound.stdout + sound.stderr);
    assert.match(sound.stdout, new RegExp(`No problems found \\(database schema ${t.schema}\\)`));
    await t.sql(`DROP INDEX "${t.schema}".jobs_claim_idx`);
    // An index left invalid, as a failed CREATE INDEX CONCURRENTLY leaves it.
    await t.sql(`UPDATE pg_index SET indisvalid = false WHERE indexrelid = '"${t.schema}".outbox_correlation_idx'::regclass`);
    const run = await runMailroom([...args, '--json']);
    assert.equal(run.code, 1, run.stdout + run.stderr);
    const report = JSON.parse(run.stdout) as { warnings: { code: string; message: string; check: string }[] };
    assert.deepEqual(report.warnings.map((w) => w.code).sort(), ['index-invalid', 'index-missing']);
    assert.ok(report.warnings.every((w) => w.check === `database schema ${t.schema}`));
    assert.match(report.warnings.find((w) => w.code === 'index-invalid')!.message, new RegExp(`REINDEX INDEX CONCURRENTLY "${t.schema}"\\.outbox_correlation_idx;`));
    assert.ok(expectedIndexes(t.schema).some((i) => i.name === 'jobs_claim_idx'));
  });
});
