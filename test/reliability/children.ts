/**
 * The mailroom processes of a reliability scenario: spawned from
 * test/reliability/node-process.ts, followed through their JSON stdout lines,
 * SIGKILLed, SIGSTOPped and resumed by the test, and replaced when killed.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { NodeProcessConfig, NodeProcessLine, NodeRole } from './definitions.ts';
import { fixtureBundle } from '../helpers/fixture-bundle.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const NODE_PROCESS = fileURLToPath(new URL('./node-process.ts', import.meta.url));
/** Bundled once, so processes restarted by a scenario boot fast (see ../helpers/fixture-bundle.ts). */
const NODE_PROCESS_JS = await fixtureBundle(NODE_PROCESS);

export interface NodeChild {
  readonly pid: number;
  readonly roles: NodeRole[];
  /** Its lines so far (the last 2,000). */
  readonly lines: NodeProcessLine[];
  /** Counts of its lines by event, all of them. */
  readonly counts: Record<string, number>;
  readonly ready: Promise<void>;
  readyAt: number;
  readonly exited: Promise<void>;
  paused: boolean;
  killedByTest: boolean;
  stderr(): string;
  proc: ChildProcess;
}

/** A scenario's processes: the live ones, every one ever spawned, and the ones that died on their own. */
export class NodeFleet {
  readonly live = new Set<NodeChild>();
  readonly all: NodeChild[] = [];
  /** Processes that exited without the test killing them (a crash of mailroom itself). */
  readonly crashed: { pid: number; roles: NodeRole[]; code: number | null; signal: string | null; stderr: string }[] = [];

  constructor(private readonly base: Omit<NodeProcessConfig, 'roles'>) {}

  /** Spawns a process running `roles`. */
  spawn(roles: NodeRole[]): NodeChild {
    const config: NodeProcessConfig = { ...this.base, roles };
    const proc = spawn(process.execPath, [NODE_PROCESS_JS, JSON.stringify(config)], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    // The start of a crash (the error and the top of its stack) and the end of what followed.
    let head = '';
    let tail = '';
    proc.stderr!.setEncoding('utf8');
    proc.stderr!.on('data', (chunk: string) => {
      if (head.length < 4000) head += chunk.slice(0, 4000 - head.length);
      else tail = (tail + chunk).slice(-4000);
    });
    const stderrText = () => (tail ? `${head}\n[...]\n${tail}` : head);
    const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
    let onReady = () => {};
    const ready = new Promise<void>((resolve, reject) => {
      onReady = resolve;
      void exited.then(() => reject(new Error(`process ${proc.pid} (${roles.join('+')}) exited before it was ready: ${stderrText()}`)));
    });
    ready.catch(() => {});
    const child: NodeChild = {
      pid: proc.pid!,
      roles,
      lines: [],
      counts: {},
      ready,
      readyAt: Number.POSITIVE_INFINITY,
      exited,
      paused: false,
      killedByTest: false,
      stderr: stderrText,
      proc,
    };
    createInterface({ input: proc.stdout! }).on('line', (text) => {
      let line: NodeProcessLine;
      try {
        line = JSON.parse(text) as NodeProcessLine;
      } catch {
        return;
      }
      child.counts[line.event] = (child.counts[line.event] ?? 0) + 1;
      child.lines.push(line);
      if (child.lines.length > 2000) child.lines.splice(0, 1000);
      if (line.event === 'ready') {
        child.readyAt = Date.now();
        onReady();
      }
    });
    proc.once('exit', (code, signal) => {
      this.live.delete(child);
      if (!child.killedByTest) this.crashed.push({ pid: child.pid, roles, code, signal, stderr: stderrText() });
    });
    this.live.add(child);
    this.all.push(child);
    return child;
  }

  /** SIGKILLs a process (a paused one too) and waits for its exit. */
  async kill(child: NodeChild): Promise<void> {
    child.killedByTest = true;
    if (child.proc.exitCode === null && child.proc.signalCode === null) child.proc.kill('SIGKILL');
    await child.exited;
  }

  /** SIGKILLs a process and spawns its replacement (same roles); resolves with the replacement. */
  async replace(child: NodeChild): Promise<NodeChild> {
    await this.kill(child);
    return this.spawn(child.roles);
  }

  pause(child: NodeChild): void {
    child.paused = true;
    child.proc.kill('SIGSTOP');
  }

  resume(child: NodeChild): void {
    child.proc.kill('SIGCONT');
    child.paused = false;
  }

  /** Live processes with a role, not paused, that have been ready at least `minUptimeMs`. */
  running(role: NodeRole, minUptimeMs = 0): NodeChild[] {
    return [...this.live].filter((c) => c.roles.includes(role) && !c.paused && !c.killedByTest && Date.now() - c.readyAt >= minUptimeMs);
  }

  /** Live processes with a role that were not killed by the test, booting ones too. */
  alive(role: NodeRole): NodeChild[] {
    return [...this.live].filter((c) => c.roles.includes(role) && !c.killedByTest);
  }

  /** Resolves when every live process is ready. */
  async allReady(): Promise<void> {
    await Promise.all([...this.live].map((c) => c.ready));
  }

  /** Sum of a line's count over every process ever spawned. */
  count(event: NodeProcessLine['event']): number {
    return this.all.reduce((n, c) => n + (c.counts[event] ?? 0), 0);
  }

  /** The last error lines of every process (for a failure message). */
  lastErrors(n = 5): string[] {
    return this.all.flatMap((c) => c.lines.filter((l) => l.event === 'error').map((l) => `${c.pid} ${'role' in l ? l.role : ''}: ${'message' in l ? l.message : ''}`)).slice(-n);
  }

  /** Kills every live process (resuming none: SIGKILL ends a stopped process too). */
  async killAll(): Promise<void> {
    await Promise.all([...this.live].map((c) => this.kill(c)));
  }
}
