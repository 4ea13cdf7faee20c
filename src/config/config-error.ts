import { MailroomError } from '../errors.ts';

/**
 * A config file that cannot be used: missing, not valid JSON, throwing at
 * import, or holding a wrong value. Names the file and, when known, the line
 * (and column); `hint` says how to fix it.
 */
export class ConfigError extends MailroomError {
  override name = 'ConfigError';
  constructor(
    /** What went wrong, without the location. */
    readonly problem: string,
    /** The file as shown to people (relative to the current directory when inside it). */
    readonly file: string | undefined,
    readonly line?: number,
    readonly column?: number,
    readonly hint?: string,
  ) {
    super(`${file === undefined ? '' : `${file}${line === undefined ? '' : `:${line}`}${line !== undefined && column !== undefined ? `:${column}` : ''}: `}${problem}`);
  }
}

/**
 * A wrong value at a key path of the config (`workers[0].concurrency`); the
 * loader turns it into a {@link ConfigError} with the key's line.
 */
export class ConfigProblem extends Error {
  override name = 'ConfigProblem';
  constructor(
    readonly path: string,
    readonly problem: string,
    readonly hint?: string,
  ) {
    super(path === '' ? problem : `${path}: ${problem}`);
  }
}
