/**
 * Progress for people: one line rewritten in place on a terminal, a line
 * every few seconds otherwise (logs, CI), and event lines in between.
 */

/** Where progress goes (stderr, so stdout carries only the result). */
export interface ProgressStream {
  write(text: string): unknown;
  isTTY?: boolean;
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
    this.current = line;
    if (this.tty) {
      this.stream.write(`\r\x1b[2K${line}`);
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
