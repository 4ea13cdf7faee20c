/**
 * The embedded database's start (src/storage/pglite-open.ts): the first new
 * database is copied into the cache, later ones start from the copy; a
 * directory that holds a database is opened as it is; a damaged copy is
 * replaced, never used; MAILROOM_PGLITE_CACHE=off turns the copy off. Each
 * database opened is used for real: migrated, a job enqueued and run.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { gunzipSync, gzipSync } from 'node:zlib';
import { after, before, describe, it } from 'node:test';
import type { PGlite } from '@electric-sql/pglite';
import { createMailroom, defineJob, handle, MailroomError } from '../src/index.ts';
import { runJobs } from '../src/testing/index.ts';
import { cacheFile, openPglite, type OpenedPglite } from '../src/storage/pglite-open.ts';

const hello = defineJob<{ to: string }>('pglite-open.hello', { queue: 'q' });

/** Migrates a mailroom on `db`, runs one job through it, and closes both. */
async function runsAJob(db: PGlite): Promise<void> {
  const mailroom = await createMailroom({ database: db, schema: 'mailroom' });
  try {
    await mailroom.migrate();
    const ran: string[] = [];
    await mailroom.enqueue(hello, { to: 'you' });
    const result = await runJobs(mailroom, { queues: ['q'], handlers: { [hello.name]: handle(hello, async (job) => void ran.push(job.data.to)) } });
    assert.equal(result.completed, 1);
    assert.deepEqual(ran, ['you']);
  } finally {
    await mailroom.close();
    await db.close();
  }
}

/** Every file under `dir` with its contents' SHA-256, to see that nothing was changed. */
function filesOf(dir: string): Record<string, string> {
  const files: Record<string, string> = {};
  for (const entry of readdirSync(dir, { recursive: true, withFileTypes: true })) {
    if (!entry.isFile()) continue;
    const path = join(entry.parentPath, entry.name);
    files[path] = createHash('sha256').update(readFileSync(path)).digest('hex');
  }
  return files;
}

/** Makes the cached copy when an earlier test has not (a test run alone with --test-name-pattern). */
async function ensureCopy(): Promise<void> {
  if (!existsSync(cacheFile()!)) await (await openPglite()).db.close();
  assert.ok(existsSync(cacheFile()!));
}

/** Opens `dir` (expecting `origin`), runs a job there, and reopens it: the database stayed in it. */
async function opensAndKeeps(dir: string, origin: OpenedPglite['origin']): Promise<void> {
  const opened = await openPglite(dir);
  assert.equal(opened.origin, origin);
  await runsAJob(opened.db);
  const reopened = await openPglite(dir);
  assert.equal(reopened.origin, 'existing', 'the directory holds the database');
  await reopened.db.close();
}

/**
 * Replaces the cached copy with its tar's first nine tenths, gzipped whole: PGlite unpacks most of
 * the database (base/, global/, pg_wal/…) from it and fails to start.
 */
async function writeCutOffCopy(): Promise<void> {
  await ensureCopy();
  const file = cacheFile()!;
  const tar = gunzipSync(readFileSync(file));
  writeFileSync(file, gzipSync(tar.subarray(0, Math.floor((tar.length * 0.9) / 512) * 512)));
}

/**
 * Makes `dir` one that nothing may be written to: immutable (`chattr +i`) for root, which permissions
 * do not bind, read-only otherwise. Returns the undo, or null when neither holds here.
 */
function lockDirectory(dir: string): (() => void) | null {
  const root = process.getuid?.() === 0;
  const lock = (): void => (root ? void execFileSync('chattr', ['+i', dir], { stdio: 'ignore' }) : chmodSync(dir, 0o500));
  const unlock = (): void => (root ? void execFileSync('chattr', ['-i', dir], { stdio: 'ignore' }) : chmodSync(dir, 0o700));
  try {
    lock();
  } catch {
    return null;
  }
  try {
    writeFileSync(join(dir, 'probe'), '');
  } catch {
    return unlock;
  }
  rmSync(join(dir, 'probe'));
  unlock();
  return null;
}

describe('opening the embedded database from the cached copy of a fresh one', () => {
  let root: string;
  const setting = process.env.MAILROOM_PGLITE_CACHE;
  before(() => {
    root = mkdtempSync(join(tmpdir(), 'mailroom-pglite-open-'));
    process.env.MAILROOM_PGLITE_CACHE = join(root, 'cache');
  });
  after(() => {
    if (setting === undefined) delete process.env.MAILROOM_PGLITE_CACHE;
    else process.env.MAILROOM_PGLITE_CACHE = setting;
    rmSync(root, { recursive: true, force: true });
  });

  it('the first new database runs initdb and leaves its copy; the next ones, in memory or in a new or empty directory, start from it', { timeout: 120_000 }, async () => {
    const file = cacheFile();
    assert.ok(file !== null && file.startsWith(join(root, 'cache')), `the copy goes where MAILROOM_PGLITE_CACHE says: ${file}`);
    assert.match(file, /pglite-\d+\.\d+\.\d+[^/]*-initdb\.tar\.gz$/, 'named after the PGlite version');
    assert.equal(existsSync(file), false);

    const first = await openPglite();
    assert.equal(first.origin, 'initdb');
    assert.ok(existsSync(file), 'the copy is written');
    await runsAJob(first.db);

    const memory = await openPglite();
    assert.equal(memory.origin, 'cache');
    await runsAJob(memory.db);

    const fresh = join(root, 'new-dir');
    const inDir = await openPglite(fresh);
    assert.equal(inDir.origin, 'cache');
    await inDir.db.exec('CREATE TABLE kept (n int); INSERT INTO kept VALUES (7)');
    await inDir.db.close();
    const again = await openPglite(fresh);
    assert.equal(again.origin, 'existing', 'a directory that holds a database is opened as it is');
    assert.deepEqual((await again.db.query<{ n: number }>('SELECT n FROM kept')).rows, [{ n: 7 }]);
    await runsAJob(again.db);

    const empty = join(root, 'empty-dir');
    mkdirSync(empty);
    const inEmpty = await openPglite(empty);
    assert.equal(inEmpty.origin, 'cache');
    await runsAJob(inEmpty.db);
  });

  it('a truncated copy is never loaded: the database runs initdb and the copy is written again', { timeout: 120_000 }, async () => {
    const file = cacheFile()!;
    await ensureCopy();
    const whole = readFileSync(file);
    writeFileSync(file, whole.subarray(0, Math.floor(whole.length / 2)));
    const dir = join(root, 'after-truncated');
    const opened = await openPglite(dir);
    assert.equal(opened.origin, 'initdb');
    await runsAJob(opened.db);
    assert.doesNotThrow(() => gunzipSync(readFileSync(file)), 'the copy is written again, whole');
    const next = await openPglite();
    assert.equal(next.origin, 'cache');
    await next.db.close();
  });

  for (const [where, dir, made] of [
    ['an empty directory', 'after-unloadable', true],
    ['a directory two levels below one that does not exist', join('not-there-yet', 'data'), false],
  ] as const) {
    it(`a copy whole to gzip whose database is cut off, for ${where}: what PGlite unpacked is removed, initdb makes the database there, and the copy is written again`, { timeout: 120_000 }, async () => {
      await writeCutOffCopy();
      const path = join(root, dir);
      if (made) mkdirSync(path);
      else assert.equal(existsSync(dirname(path)), false);
      await opensAndKeeps(path, 'initdb');
      const next = await openPglite();
      assert.equal(next.origin, 'cache', 'the copy is written again');
      await next.db.close();
    });
  }

  it('a directory whose parents do not exist is made with them, and the database starts there from the copy', { timeout: 120_000 }, async () => {
    await ensureCopy();
    const dir = join(root, 'no-parent', 'var', 'data');
    await opensAndKeeps(dir, 'cache');
    assert.ok(existsSync(cacheFile()!), 'the copy is kept');
  });

  it('a directory with other files in it is left to PGlite: the copy is not unpacked over them', { timeout: 120_000 }, async () => {
    await ensureCopy();
    const dir = join(root, 'not-a-database');
    mkdirSync(dir);
    writeFileSync(join(dir, 'notes.txt'), 'mine');
    const opened = await openPglite(dir);
    assert.equal(opened.origin, 'initdb');
    assert.equal(readFileSync(join(dir, 'notes.txt'), 'utf8'), 'mine');
    await runsAJob(opened.db);
  });

  it('a path that is a file is refused with an error naming it, and the file is left as it was', async () => {
    await ensureCopy();
    const path = join(root, 'a-file');
    writeFileSync(path, 'mine');
    await assert.rejects(openPglite(path), (error: unknown) => error instanceof MailroomError && error.message.includes(`${path} is a file, not a directory`));
    assert.equal(readFileSync(path, 'utf8'), 'mine');
  });

  it('a path below a file is refused with an error naming the file, and the file is left as it was', async () => {
    const file = join(root, 'a-plain-file');
    writeFileSync(file, 'mine');
    const path = join(file, 'sub', 'db');
    await assert.rejects(openPglite(path), (error: unknown) => error instanceof MailroomError && error.message.includes(`${path} cannot be made: ${file} is a file`));
    assert.equal(readFileSync(file, 'utf8'), 'mine');
  });

  it('a directory PGlite may not write to fails with an error naming it, and the good copy is kept', { timeout: 120_000 }, async (t) => {
    await ensureCopy();
    const copy = readFileSync(cacheFile()!);
    const dir = join(root, 'not-writable');
    mkdirSync(dir);
    const unlock = lockDirectory(dir);
    try {
      if (unlock === null) {
        t.skip('cannot make a directory unwritable here (not root with chattr, and chmod does not bind root)');
        return;
      }
      await assert.rejects(openPglite(dir), (error: unknown) => error instanceof MailroomError && error.message.includes(`could not open the embedded database in ${dir}`) && error.message.includes('check that the directory is writable'));
      assert.deepEqual(readFileSync(cacheFile()!), copy, 'the copy was not to blame, and is kept as it was');
    } finally {
      unlock?.();
    }
    await opensAndKeeps(dir, 'cache');
  });

  it('a directory made by another PostgreSQL major version is refused with an error naming both, and left as it was', { timeout: 120_000 }, async () => {
    await ensureCopy();
    const dir = join(root, 'other-major');
    const opened = await openPglite(dir);
    await runsAJob(opened.db);
    const made = readFileSync(join(dir, 'PG_VERSION'), 'utf8').trim();
    const other = String(Number(made) + 1);
    writeFileSync(join(dir, 'PG_VERSION'), `${other}\n`);
    const files = filesOf(dir);
    await assert.rejects(openPglite(dir), (error: unknown) => {
      assert.ok(error instanceof MailroomError);
      assert.match(error.message, new RegExp(`in ${dir} was made by PostgreSQL ${other}, and this mailroom's embedded PostgreSQL ${made} \\(PGlite \\d`));
      assert.match(error.message, /opens only with the PostgreSQL major version that made it/);
      return true;
    });
    assert.deepEqual(filesOf(dir), files, 'no file of the directory was changed');
    writeFileSync(join(dir, 'PG_VERSION'), `${made}\n`);
    const reopened = await openPglite(dir);
    assert.equal(reopened.origin, 'existing');
    try {
      assert.deepEqual((await reopened.db.query<{ state: string }>('SELECT state FROM mailroom.jobs')).rows, [{ state: 'completed' }]);
    } finally {
      await reopened.db.close();
    }
  });

  it('MAILROOM_PGLITE_CACHE=off: no copy is read', { timeout: 120_000 }, async () => {
    await ensureCopy();
    process.env.MAILROOM_PGLITE_CACHE = 'off';
    try {
      assert.equal(cacheFile(), null);
      const opened = await openPglite();
      assert.equal(opened.origin, 'initdb');
      await opened.db.close();
    } finally {
      process.env.MAILROOM_PGLITE_CACHE = join(root, 'cache');
    }
  });
});
