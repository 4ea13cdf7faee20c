/**
 * Progress for people: one line rewritten in place on a terminal, a line
 * every few seconds otherwise (logs, CI), and event lines in between.
 */

/** Where progress goes (stderr, so stdout carries only the result). */
export interface ProgressStream {
  write(text: string): unknown;
  isTTY?: boolean;
  /** Terminal width; a redrawn line is cut to fit, or it would wrap and leave copies behind. */
  columns?: number;
}

/** A progress line that is redrawn on a TTY and printed periodically elsewhere. */
export class Progress {
  private current = '';
  private lastPrinted = 0;

  constructor(
    private readonly stream: ProgressStream,
    private readonly enabled: boolean,
    private readonly periodMs = 2000,
  ) {}

  private get tty(): boolean {
    return this.stream.isTTY === true;
  }

  /** Shows the newest state (on a TTY at once; elsewhere at most every `periodMs`). */
  update(line: string): void {
    if (!this.enabled) return;
    this.current = this.stream.columns && line.length >= this.stream.columns ? `${line.slice(0, this.stream.columns - 2)}…` : line;
    if (this.tty) {
      this.stream.write(`\r\x1b[2K${this.current}`);
    } else if (Date.now() - this.lastPrinted >= this.periodMs) {
      this.lastPrinted = Date.now();
      this.stream.write(`${line}\n`);
    }
  }

  /** Prints an event on its own line, keeping the progress line below it. */
  log(line: string): void {
    if (!this.enabled) return;
    if (this.tty) this.stream.write(`\r\x1b[2K${line}\n${this.current}`);
    else this.stream.write(`${line}\n`);
  }

  /** Leaves the last progress line in place and ends it. */
  finish(line: string): void {
    if (!this.enabled) return;
    if (this.tty) this.stream.write(`\r\x1b[2K${line}\n`);
    else this.stream.write(`${line}\n`);
    this.current = '';
  }
}

/**
 * Logs an error message the 1st, 10th, 100th... time it is seen, so a
 * database outage does not flood the output.
 */
export function errorLogger(log: (line: string) => void): (error: unknown) => void {
  const seen = new Map<string, number>();
  return (error) => {
    const message = error instanceof Error ? error.message : String(error);
    const count = (seen.get(message) ?? 0) + 1;
    seen.set(message, count);
    if (Number.isInteger(Math.log10(count))) log(`${message}${count > 1 ? ` (${count} times)` : ''}`);
  };
}
