/**
 * A worker fixture run as a child process of a test, printing one JSON line per
 * event (test/fixtures/crash-worker.ts, effects-worker.ts): its lines are
 * collected, `ready` resolves with the worker's id, and an exit the test did not
 * cause is told apart from a kill.
 *
 * @example
 * const children = new Set<ChildWorker<CrashWorkerLine>>();
 * const child = spawnChildWorker<CrashWorkerLine>(FIXTURE_JS, config, { cwd: ROOT, registry: children });
 * await child.ready;
 * await child.waitFor((l) => l.event === 'completed', 5000, 'a completion');
 * await killChildWorker(child);
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';

/** What every fixture line has; the `ready` line also carries the worker's id. */
export interface FixtureLine {
  event: string;
}

export interface ChildWorker<Line extends FixtureLine> {
  proc: ChildProcess;
  pid: number;
  lines: Line[];
  /** Resolves with the worker id once the worker started; rejects if the process exits first. */
  ready: Promise<string>;
  /** The worker's id, once it printed `ready`. */
  workerId: string | undefined;
  /** When it printed `ready` (Date.now() of this process); +Infinity before. */
  readyAt: number;
  exited: Promise<void>;
  /** Set (by {@link killChildWorker}) before the test kills it: an exit without it is the worker's own crash. */
  killedByTest: boolean;
  /** The last 8,000 characters of its stderr. */
  stderr(): string;
  /** Resolves with the first line (seen so far or later) that matches; rejects after `timeoutMs`, naming `what`. */
  waitFor(match: (line: Line) => boolean, timeoutMs: number, what: string): Promise<Line>;
}

export interface SpawnOptions<Line extends FixtureLine> {
  cwd: string;
  /** Where the child is kept while it lives (taken out when it exits). */
  registry: Set<ChildWorker<Line>>;
  /**
   * 'pipe' keeps the child's stdin open, so a fixture that exits when it closes dies with this
   * process even when the test could not clean up. Default 'ignore'.
   */
  stdin?: 'pipe' | 'ignore';
  /** Called when it exits, with how. */
  onExit?: (child: ChildWorker<Line>, code: number | null, signal: NodeJS.Signals | null) => void;
}

/** Runs `script` (a bundled fixture) with `config` as its JSON argument; see the module's example. */
export function spawnChildWorker<Line extends FixtureLine>(script: string, config: unknown, options: SpawnOptions<Line>): ChildWorker<Line> {
  const proc = spawn(process.execPath, [script, JSON.stringify(config)], { cwd: options.cwd, stdio: [options.stdin ?? 'ignore', 'pipe', 'pipe'] });
  const lines: Line[] = [];
  const waiters = new Set<(line: Line) => void>();
  let stderr = '';
  proc.stderr!.setEncoding('utf8');
  proc.stderr!.on('data', (chunk: string) => {
    stderr = (stderr + chunk).slice(-8000);
  });
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
  let onReady: (id: string) => void = () => {};
  const ready = new Promise<string>((resolve, reject) => {
    onReady = resolve;
    void exited.then(() => reject(new Error(`worker ${proc.pid} exited before it was ready: ${stderr}`)));
  });
  ready.catch(() => {}); // a child killed before it was ready is fine
  const child: ChildWorker<Line> = {
    proc,
    pid: proc.pid!,
    lines,
    ready,
    workerId: undefined,
    readyAt: Number.POSITIVE_INFINITY,
    exited,
    killedByTest: false,
    stderr: () => stderr,
    waitFor(match, timeoutMs, what) {
      const seen = lines.find(match);
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what} from worker ${proc.pid}; it printed ${JSON.stringify(lines)}; stderr: ${stderr}`));
        }, timeoutMs);
        const check = (line: Line): void => {
          if (!match(line)) return;
          clearTimeout(timer);
          waiters.delete(check);
          resolve(line);
        };
        waiters.add(check);
      });
    },
  };
  createInterface({ input: proc.stdout! }).on('line', (text) => {
    let line: Line;
    try {
      line = JSON.parse(text) as Line;
    } catch {
      return; // not one of ours
    }
    lines.push(line);
    if (line.event === 'ready') {
      child.workerId = String((line as FixtureLine & { workerId?: unknown }).workerId);
      child.readyAt = Date.now();
      onReady(child.workerId);
    }
    for (const waiter of [...waiters]) waiter(line);
  });
  proc.once('exit', (code, signal) => {
    options.registry.delete(child);
    options.onExit?.(child, code, signal);
  });
  options.registry.add(child);
  return child;
}

/** SIGKILLs the child (a stopped one too) unless it already exited, marking it killed by the test; resolves once it exited. */
export async function killChildWorker(child: ChildWorker<FixtureLine>): Promise<void> {
  child.killedByTest = true;
  if (child.proc.exitCode === null && child.proc.signalCode === null) child.proc.kill('SIGKILL');
  await child.exited;
}
