/**
 * Opening the embedded database (PGlite) without paying for `initdb` every
 * time. A new PGlite database runs `initdb` inside WebAssembly: about 6 s of
 * CPU on a small machine, against about 2 s to start from a copy of a database
 * fresh from `initdb`. The first new database made with a given PGlite version
 * is copied (before anything is written to it) into a per-user cache; later
 * new databases start from that copy. A directory that already holds a
 * database is opened as it is; the copy goes only into memory, a new
 * directory or an empty one; and a copy that cannot be read or written never
 * fails an open: the database is then made the slow way.
 *
 * `MAILROOM_PGLITE_CACHE`: a directory for the copy instead of the user's
 * cache directory, or `off` for none.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { homedir, platform } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gunzipSync } from 'node:zlib';
import { PGlite } from '@electric-sql/pglite';
import { MailroomError } from '../errors.ts';

/** Where a database came from: a directory that held one, the cached copy, or `initdb`. */
export type PgliteOrigin = 'existing' | 'cache' | 'initdb';

/** An open PGlite database and where it came from. */
export interface OpenedPglite {
  db: PGlite;
  origin: PgliteOrigin;
}

/**
 * Opens PGlite on `dataDir` (made when missing), or in memory when it is
 * undefined; a new database starts from the cached copy of a fresh one when
 * there is one.
 *
 * @example
 * const { db } = await openPglite('./.mailroom');
 * const memory = (await openPglite()).db;
 */
export async function openPglite(dataDir?: string): Promise<OpenedPglite> {
  const before = dataDir === undefined ? 'memory' : directoryState(dataDir);
  if (before === 'not a directory') throw notADirectory(dataDir!);
  if (before === 'database') return { db: await openExisting(dataDir!), origin: 'existing' };
  // PGlite makes the directory itself, but not its parents: './var/mailroom/db' failed with ENOENT when ./var was missing.
  if (before === 'missing') mkdirSync(dirname(dataDir!), { recursive: true });
  // Only into memory, a new directory or an empty one: a failed load can then be undone whole.
  const file = before === 'other files' ? null : cacheFile();
  const copy = file === null ? null : readCopy(file);
  let copyFailed = false;
  if (copy !== null && file !== null) {
    try {
      return { db: await PGlite.create(dataDir, { loadDataDir: new Blob([copy]) }), origin: 'cache' };
    } catch {
      // Undone, and made again below. Only when that works was the copy to blame (a directory
      // PGlite cannot write to fails both ways, and the good copy is kept).
      copyFailed = true;
      if (dataDir !== undefined) emptyDirectory(dataDir, before === 'missing');
    }
  }
  const db = await create(dataDir);
  if (file !== null) {
    if (copyFailed) rmSync(file, { force: true });
    await saveCopy(db, file);
  }
  return { db, origin: 'initdb' };
}

/** `PGlite.create`, its failures told as errors that name the directory (its own carry only an errno). */
async function create(dataDir: string | undefined): Promise<PGlite> {
  try {
    return await PGlite.create(dataDir);
  } catch (error) {
    const where = dataDir === undefined ? 'in memory' : `in ${dataDir}`;
    throw new MailroomError(`could not open the embedded database ${where}: ${pgliteFailure(error)}`, { cause: error });
  }
}

/**
 * Opens a directory that holds a database. PGlite reports a directory made by another PostgreSQL
 * major version only as "failed to initialize"; that case is told as what it is, with the way out.
 */
async function openExisting(dataDir: string): Promise<PGlite> {
  try {
    return await create(dataDir);
  } catch (error) {
    const made = directoryMajor(dataDir);
    const runs = pglitePostgresMajor();
    // Unknown on either side, or the same major: the failure is something else, and PGlite's error stands.
    if (made === null || runs === null || made === runs) throw error;
    throw new MailroomError(
      `the embedded database in ${dataDir} was made by PostgreSQL ${made}, and this mailroom's embedded PostgreSQL ${runs} (PGlite ${pgliteVersion() ?? 'of unknown version'}) cannot open it: a data directory opens only with the PostgreSQL major version that made it. ` +
        `Finish its jobs and events with the mailroom version that made it and then give this one a new directory, or move to a PostgreSQL server (DATABASE_URL). The directory was left as it was.`,
      { cause: error },
    );
  }
}

/** The PostgreSQL major version a data directory was made by (its PG_VERSION file), or null. */
function directoryMajor(dataDir: string): string | null {
  try {
    const text = readFileSync(join(dataDir, 'PG_VERSION'), 'utf8').trim();
    return /^\d+$/.test(text) ? text : null;
  } catch {
    return null;
  }
}

let postgresMajor: string | null | undefined;

/**
 * The PostgreSQL major version the installed PGlite runs, read from its WebAssembly build's version
 * string ("PostgreSQL 19.0 (PGlite 0.6.1) on …"); null when the build is not where its package puts
 * it (a bundled application). Read only when a directory failed to open.
 */
function pglitePostgresMajor(): string | null {
  if (postgresMajor !== undefined) return postgresMajor;
  postgresMajor = null;
  try {
    const wasm = join(pgliteEntryDir(), 'pglite.wasm');
    postgresMajor = /PostgreSQL (\d+)\.\d+ \(PGlite /.exec(readFileSync(wasm).toString('latin1'))?.[1] ?? null;
  } catch {
    postgresMajor = null;
  }
  return postgresMajor;
}

/** Emscripten's file system errors carry a WASI errno and no message; the common ones by name. */
const WASI_ERRNO: Record<number, string> = { 2: 'permission denied (EACCES)', 44: 'no such file or directory (ENOENT)', 51: 'no space left on the device (ENOSPC)', 54: 'a part of the path is not a directory (ENOTDIR)', 63: 'operation not permitted (EPERM)', 69: 'read-only file system (EROFS)' };

function pgliteFailure(error: unknown): string {
  const errno = (error as { errno?: unknown } | null)?.errno;
  if (typeof errno === 'number') return `${WASI_ERRNO[errno] ?? `file system error ${errno}`}; check that the directory is writable and its disk not full, or give another directory`;
  return error instanceof Error ? error.message : String(error);
}

/** The error for a path PGlite cannot use as a directory: it is a file, or a file stands where a parent should be. */
function notADirectory(dataDir: string): MailroomError {
  let path = dataDir;
  while (dirname(path) !== path && !existsSync(path)) path = dirname(path);
  if (path === dataDir) return new MailroomError(`the embedded database's directory ${dataDir} is a file, not a directory: give a directory (a new one is made), or move the file`);
  return new MailroomError(`the embedded database's directory ${dataDir} cannot be made: ${path} is a file, not a directory; give another path, or move the file`);
}

type DirectoryState = 'missing' | 'empty' | 'database' | 'other files' | 'not a directory';

function directoryState(dir: string): DirectoryState {
  if (existsSync(join(dir, 'PG_VERSION'))) return 'database';
  try {
    return readdirSync(dir).length === 0 ? 'empty' : 'other files';
  } catch (error) {
    // Only a path with nothing at it is 'missing' (a failed load may then remove what it made); a
    // directory that cannot be read is left to PGlite and its own error.
    const code = (error as NodeJS.ErrnoException).code;
    return code === 'ENOENT' ? 'missing' : code === 'ENOTDIR' ? 'not a directory' : 'other files';
  }
}

/** Removes what a failed load left in `dir`: the directory itself when it was made for it. */
function emptyDirectory(dir: string, made: boolean): void {
  if (made) {
    rmSync(dir, { recursive: true, force: true });
    return;
  }
  for (const entry of readdirSync(dir)) rmSync(join(dir, entry), { recursive: true, force: true });
}

/** The cached copy's path for this PGlite version, or null when the cache is off or its place unknown. */
export function cacheFile(): string | null {
  const setting = process.env.MAILROOM_PGLITE_CACHE;
  if (setting === 'off') return null;
  const dir = setting !== undefined && setting !== '' ? setting : userCacheDir();
  const version = pgliteVersion();
  if (dir === null || version === null) return null;
  return join(dir, `pglite-${version}-initdb.tar.gz`);
}

/** The user's cache directory for mailroom (XDG on Linux, Library/Caches on macOS, LOCALAPPDATA on Windows). */
function userCacheDir(): string | null {
  try {
    if (platform() === 'win32') return process.env.LOCALAPPDATA ? join(process.env.LOCALAPPDATA, 'mailroom', 'Cache') : null;
    if (platform() === 'darwin') return join(homedir(), 'Library', 'Caches', 'mailroom');
    const base = process.env.XDG_CACHE_HOME || join(homedir(), '.cache');
    return join(base, 'mailroom');
  } catch {
    return null; // no home directory (a system user): no cache
  }
}

/** The directory of the installed PGlite's entry module (its dist/). */
const pgliteEntryDir = (): string => dirname(fileURLToPath(import.meta.resolve('@electric-sql/pglite')));

let version: string | null | undefined;

/** The installed PGlite's version, from its package.json (which its exports do not list). */
function pgliteVersion(): string | null {
  if (version !== undefined) return version;
  version = null;
  try {
    let dir = pgliteEntryDir();
    for (let up = 0; up < 4 && version === null; up++, dir = dirname(dir)) {
      const path = join(dir, 'package.json');
      if (!existsSync(path)) continue;
      const found = (JSON.parse(readFileSync(path, 'utf8')) as { name?: string; version?: string });
      if (found.name === '@electric-sql/pglite' && typeof found.version === 'string') version = found.version;
    }
  } catch {
    version = null;
  }
  return version;
}

/**
 * The copy as a tar, or null when there is none. A damaged copy (a truncated or altered file) fails
 * gzip's length and CRC checks here and is removed: PGlite, given one, rejects outside the promise
 * it returns and ends the process.
 */
function readCopy(file: string): Buffer | null {
  let compressed: Buffer;
  try {
    compressed = readFileSync(file);
  } catch {
    return null;
  }
  try {
    return gunzipSync(compressed);
  } catch {
    rmSync(file, { force: true });
    return null;
  }
}

/** Writes the fresh database's copy: whole or not at all (renamed into place), and never an error. */
async function saveCopy(db: PGlite, file: string): Promise<void> {
  const partial = `${file}.${process.pid}.${Date.now().toString(36)}.partial`;
  try {
    const dump = await db.dumpDataDir('gzip');
    mkdirSync(dirname(file), { recursive: true, mode: 0o700 });
    writeFileSync(partial, new Uint8Array(await dump.arrayBuffer()), { mode: 0o600 });
    renameSync(partial, file);
  } catch {
    rmSync(partial, { force: true }); // a read-only or full disk: the next new database runs initdb again
  }
}
