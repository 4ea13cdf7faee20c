/**
 * Finds and loads the config file of `mailroom start`: `--config PATH`, else
 * the first of mailroom.config.{ts,mts,js,mjs,json} in the current directory.
 * Code configs are imported (TypeScript through tsx when Node cannot load it
 * itself); JSON is checked by a strict scanner so errors name the line.
 * Every failure is a {@link ConfigError} naming the file, and the line when
 * there is one.
 */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { basename, dirname, extname, isAbsolute, join, relative, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { ConfigError, ConfigProblem } from './config-error.ts';
import type { MailroomConfig } from './define-config.ts';
import { JsonSyntaxError, scanJson } from './json-scan.ts';
import { findKeyLine, jsonKeyLine, lineColumn } from './key-path.ts';
import { validateConfig, type ConfigKind } from './validate-config.ts';

/** The file names looked for in the current directory, in this order. */
export const CONFIG_FILE_NAMES = ['mailroom.config.ts', 'mailroom.config.mts', 'mailroom.config.js', 'mailroom.config.mjs', 'mailroom.config.json'] as const;

const CODE_EXTENSIONS = new Set(['.ts', '.mts', '.cts', '.js', '.mjs', '.cjs']);

/** A loaded, validated config and where it came from. */
export interface LoadedConfig {
  /** Absolute path of the file. */
  path: string;
  /** The file as shown to people. */
  display: string;
  kind: ConfigKind;
  config: MailroomConfig;
}

const EXAMPLE = [
  'write mailroom.config.ts in this directory, e.g.',
  "  import { defineConfig } from 'mailroom';",
  "  import { sendWelcome, onSendWelcome } from './jobs.ts';",
  '  export default defineConfig({',
  '    database: process.env.DATABASE_URL,',
  "    workers: [{ queues: ['email'], handlers: { [sendWelcome.name]: onSendWelcome } }],",
  '  });',
  'or mailroom.config.json without workers ({ "schema": "mailroom", "relay": {} }), or pass --config PATH',
].join('\n');

function shown(path: string, cwd: string): string {
  const rel = relative(cwd, path);
  return rel !== '' && !rel.startsWith('..') && !isAbsolute(rel) ? rel : path;
}

/**
 * The config file to use: `explicit` (resolved against `cwd`), else the
 * first of {@link CONFIG_FILE_NAMES} in `cwd`. Throws a ConfigError saying
 * how to write one when there is none.
 */
export function findConfigFile(explicit: string | undefined, cwd: string): string {
  if (explicit !== undefined) {
    const path = resolve(cwd, explicit);
    if (!existsSync(path)) throw new ConfigError(`config file not found (--config ${explicit})`, shown(path, cwd), undefined, undefined, 'check the path; it is resolved against the current directory');
    if (statSync(path).isDirectory()) throw new ConfigError('--config names a directory; name the file', shown(path, cwd), undefined, undefined, `e.g. --config ${join(explicit, CONFIG_FILE_NAMES[0])}`);
    const ext = extname(path);
    if (!CODE_EXTENSIONS.has(ext) && ext !== '.json') {
      throw new ConfigError(`a config file must end in .ts, .mts, .js, .mjs or .json, not ${JSON.stringify(ext || basename(path))}`, shown(path, cwd));
    }
    return path;
  }
  for (const name of CONFIG_FILE_NAMES) {
    const path = join(cwd, name);
    if (existsSync(path)) return path;
  }
  throw new ConfigError(`no config file: none of ${CONFIG_FILE_NAMES.join(', ')} in ${cwd}`, undefined, undefined, undefined, EXAMPLE);
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/** Where in `path` an error was raised: the first stack frame (or esbuild location) in that file. */
function locationIn(error: unknown, path: string, source: string): { line: number; column?: number } | undefined {
  const text = error instanceof Error ? `${error.stack ?? ''}\n${error.message}` : String(error);
  const url = pathToFileURL(path).href;
  const pattern = new RegExp(`(?:${escapeRegExp(url)}|${escapeRegExp(path)})(?:\\?[^:\\s)]*)?:(\\d+)(?::(\\d+))?`);
  const match = pattern.exec(text);
  if (match) return { line: Number(match[1]), ...(match[2] ? { column: Number(match[2]) } : {}) };
  // "Cannot find module '…/jobs.ts' imported from …": the line of that import.
  const missing = /Cannot find (?:module|package) '([^']+)'/.exec(text)?.[1];
  if (missing !== undefined) {
    for (const needle of [missing, basename(missing)]) {
      const at = source.indexOf(needle);
      if (at >= 0) return { line: lineColumn(source, at).line };
    }
  }
  return undefined;
}

function thrownAtLoad(error: unknown, path: string, display: string, source: string, when: string): ConfigError {
  const where = locationIn(error, path, source);
  const description = error instanceof Error ? `${error.name}: ${error.message.split('\n')[0]}` : String(error);
  return new ConfigError(`${when}: ${description}`, display, where?.line, where?.column, 'fix the config at that line; MAILROOM_DEBUG=1 prints the whole stack');
}

function isUnknownExtension(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === 'ERR_UNKNOWN_FILE_EXTENSION';
}

/**
 * Lets Node import TypeScript: tsx (resolved from the config's directory)
 * registered for this process, so the config and what it imports share the
 * module cache with mailroom itself (one job registry).
 */
async function registerTsx(path: string, display: string): Promise<void> {
  const requireHere = createRequire(path);
  let packageJson: string;
  try {
    packageJson = requireHere.resolve('tsx/package.json');
  } catch {
    throw new ConfigError(
      'this config is TypeScript, and Node.js cannot load TypeScript on its own',
      display,
      undefined,
      undefined,
      'install tsx where the config is (npm i -D tsx), or compile the config to mailroom.config.js',
    );
  }
  const pkg = JSON.parse(readFileSync(packageJson, 'utf8')) as { exports?: Record<string, { import?: { default?: string } | string } | string> };
  const entry = pkg.exports?.['./esm/api'];
  const file = typeof entry === 'object' && typeof entry.import === 'object' ? entry.import.default : undefined;
  const api = (await import(pathToFileURL(join(dirname(packageJson), file ?? 'dist/esm/api/index.mjs')).href)) as { register?: () => unknown };
  if (typeof api.register !== 'function') {
    throw new ConfigError('the installed tsx has no tsx/esm/api register(); it is too old to load this config', display, undefined, undefined, 'upgrade it (npm i -D tsx@latest), or compile the config to .js');
  }
  api.register();
}

async function importCode(path: string, display: string, source: string): Promise<unknown> {
  const url = pathToFileURL(path).href;
  let module: { default?: unknown };
  try {
    module = (await import(url)) as { default?: unknown };
  } catch (error) {
    if (!isUnknownExtension(error)) throw thrownAtLoad(error, path, display, source, 'the config failed while loading');
    await registerTsx(path, display);
    try {
      module = (await import(`${url}?mailroom-config`)) as { default?: unknown };
    } catch (again) {
      throw thrownAtLoad(again, path, display, source, 'the config failed while loading');
    }
  }
  if (module.default === undefined) {
    throw new ConfigError('the config has no default export', display, undefined, undefined, 'export it: export default defineConfig({ … }) (defineConfig comes from mailroom)');
  }
  let value: unknown = module.default;
  try {
    if (typeof value === 'function') value = await (value as () => unknown)();
    else value = await value;
  } catch (error) {
    throw thrownAtLoad(error, path, display, source, 'the config function threw');
  }
  return value;
}

function parseJson(source: string, display: string): { value: unknown; offsets: Map<string, number> } {
  let offsets: Map<string, number>;
  try {
    offsets = scanJson(source);
  } catch (error) {
    if (!(error instanceof JsonSyntaxError)) throw error;
    const { line, column } = lineColumn(source, error.offset);
    throw new ConfigError(`invalid JSON: ${error.message}`, display, line, column, 'JSON has no comments, trailing commas or single quotes; for those, write mailroom.config.ts');
  }
  try {
    return { value: JSON.parse(source) as unknown, offsets };
  } catch (error) {
    throw new ConfigError(`invalid JSON: ${(error as Error).message}`, display);
  }
}

/**
 * Loads and validates the config at `path`. A wrong value becomes a
 * ConfigError naming the key path and its line (exact for JSON, a
 * best-effort search of the source for code).
 *
 * @example
 * const { config, display } = await loadConfig(findConfigFile(undefined, process.cwd()), process.cwd());
 */
export async function loadConfig(path: string, cwd: string): Promise<LoadedConfig> {
  const display = shown(path, cwd);
  let source: string;
  try {
    source = readFileSync(path, 'utf8').replace(/^\uFEFF/, '');
  } catch (error) {
    throw new ConfigError(`cannot read the config: ${(error as Error).message}`, display);
  }
  const kind: ConfigKind = extname(path) === '.json' ? 'json' : 'code';
  let value: unknown;
  let lineOf: (keyPath: string) => number | undefined;
  if (kind === 'json') {
    const parsed = parseJson(source, display);
    value = parsed.value;
    lineOf = (keyPath) => jsonKeyLine(source, parsed.offsets, keyPath);
  } else {
    if (!CODE_EXTENSIONS.has(extname(path))) throw new ConfigError('unsupported config file type', display);
    value = await importCode(path, display, source);
    lineOf = (keyPath) => findKeyLine(source, keyPath);
  }
  try {
    return { path, display, kind, config: validateConfig(value, kind) };
  } catch (error) {
    if (!(error instanceof ConfigProblem)) throw error;
    const line = error.path === '' ? undefined : lineOf(error.path);
    throw new ConfigError(error.message, display, line, undefined, error.hint);
  }
}
