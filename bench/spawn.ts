/** Starting TypeScript child processes of the benchmark (through tsx, as the benchmark itself runs). */
import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const TSX = import.meta.resolve('tsx');

/** Forks `file` (a path relative to bench/) with tsx, IPC with structured clone (typed arrays pass as they are). */
export function forkTs(file: string, env: Record<string, string>): ChildProcess {
  const path = fileURLToPath(new URL(file, import.meta.url));
  return fork(path, [], {
    execArgv: ['--import', TSX],
    env: { ...process.env, ...env },
    serialization: 'advanced',
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
}

/**
 * Resolves with the first message that `accept` takes; rejects with what
 * `accept` throws, or if the child's IPC channel closes first. (Not on 'exit': a child that sends and exits at
 * once may be seen to exit before its last message is read.)
 */
export function nextMessage<M, T>(child: ChildProcess, accept: (message: M) => T | undefined): Promise<T> {
  return new Promise((resolve, reject) => {
    const onMessage = (message: M) => {
      let value: T | undefined;
      try {
        value = accept(message);
      } catch (error) {
        cleanup();
        reject(error);
        return;
      }
      if (value === undefined) return;
      cleanup();
      resolve(value);
    };
    const onClosed = () => {
      cleanup();
      reject(new Error(`child process ${child.pid} ended (code ${child.exitCode}, signal ${child.signalCode}) before answering`));
    };
    const cleanup = () => {
      child.off('message', onMessage);
      child.off('disconnect', onClosed);
    };
    child.on('message', onMessage);
    child.on('disconnect', onClosed);
    if (!child.connected) onClosed();
  });
}
