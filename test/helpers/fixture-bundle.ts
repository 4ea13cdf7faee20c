/**
 * Fixture processes started from one JavaScript bundle instead of through tsx.
 *
 * The crash tests start dozens of replacement workers. Through `--import tsx`
 * each one spends about a second of CPU before it claims anything (1.4 s to
 * ready here, 7 s with another crash test running beside it on 2 cores, which
 * left the kill loops with no worker running). Bundled once per test process
 * with esbuild (the compiler tsx itself runs), a worker is ready in about
 * 0.45 s. The bundle holds the fixture and mailroom's `src/`; packages stay
 * external and resolve from the project's node_modules, so it is written there,
 * two directories below the project like `src/<dir>/<file>.ts`: the files
 * `src/` finds from `import.meta.url` (sql/migrations/, package.json) resolve
 * to the same paths from the bundle.
 */
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const CACHE = join(ROOT, 'node_modules', '.cache');
const bundles = new Map<string, Promise<string>>();

/**
 * The path of a runnable bundle of `fixture` (an absolute path to a `.ts`
 * file): `spawn(process.execPath, [await fixtureBundle(FIXTURE), ...args])`.
 * Built once per test process; named by its content, so concurrent test files
 * never overwrite each other's.
 */
export function fixtureBundle(fixture: string): Promise<string> {
  let bundle = bundles.get(fixture);
  if (!bundle) {
    bundle = buildBundle(fixture);
    bundles.set(fixture, bundle);
  }
  return bundle;
}

async function buildBundle(fixture: string): Promise<string> {
  const result = await build({
    entryPoints: [fixture],
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    packages: 'external',
    write: false,
    logLevel: 'silent',
  });
  const code = result.outputFiles[0]!.contents;
  const hash = createHash('sha256').update(code).digest('hex').slice(0, 16);
  const path = join(CACHE, `mailroom-fixture-${basename(fixture, '.ts')}-${hash}.mjs`);
  if (!existsSync(path)) {
    mkdirSync(CACHE, { recursive: true });
    const partial = `${path}.${process.pid}.tmp`;
    writeFileSync(partial, code);
    renameSync(partial, path); // atomic: a concurrent reader sees the whole file or none
  }
  return path;
}
