/**
 * The `mailroom` command line as the tests run it: the package's own binary
 * (`bin/mailroom.js`, the compiled CLI in dist/, which `npm test` builds
 * first) in a child process, without DATABASE_URL (the embedded default must
 * not turn into someone's server). It starts in about a third of the time
 * the sources take through tsx.
 */
import { spawn, type ChildProcessByStdio } from 'node:child_process';
import type { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { WASM_FLAGS } from './wasm-flags.ts';

export const BIN = fileURLToPath(new URL('../../bin/mailroom.js', import.meta.url));

/** One finished run. */
export interface CliRun {
  args: string[];
  code: number | null;
  stdout: string;
  stderr: string;
}

export type CliChild = ChildProcessByStdio<null, Readable, Readable>;

/** Starts `mailroom ...args`; the caller reads its output. */
export function spawnMailroom(args: string[], options: { cwd?: string } = {}): CliChild {
  const env = { ...process.env };
  delete env.DATABASE_URL;
  return spawn(process.execPath, [...WASM_FLAGS, BIN, ...args], { cwd: options.cwd ?? process.cwd(), env, stdio: ['ignore', 'pipe', 'pipe'] });
}

/**
 * Runs `mailroom ...args` to its end. `onStderr` sees stderr as it arrives
 * (and may signal the child). A run that outlives `timeoutMs` is killed and
 * fails the test with its output.
 */
export function runMailroom(
  args: string[],
  options: { cwd?: string; timeoutMs?: number; onStderr?: (text: string, child: CliChild) => void } = {},
): Promise<CliRun> {
  const timeoutMs = options.timeoutMs ?? 30_000;
  return new Promise((resolve, reject) => {
    const child = spawnMailroom(args, options);
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => {
      stderr += chunk.toString();
      options.onStderr?.(stderr, child);
    });
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`mailroom ${args.join(' ')} did not finish within ${timeoutMs} ms\nstdout:\n${stdout}\nstderr:\n${stderr}`));
    }, timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ args, code, stdout, stderr });
    });
  });
}

/** A run as text, for assertion messages. */
export function showRun(run: CliRun): string {
  return `\n$ mailroom ${run.args.join(' ')}\nexit ${run.code}\nstdout:\n${run.stdout}\nstderr:\n${run.stderr}`;
}

/** A run's stdout as JSON, or a failure showing the run. */
export function runJson<T>(run: CliRun): T {
  try {
    return JSON.parse(run.stdout) as T;
  } catch {
    throw new Error(`stdout is not JSON${showRun(run)}`);
  }
}
