/**
 * Progress of a long command on stderr: a bar redrawn in place when stderr is
 * a terminal, otherwise plain lines (the first at once, then about one a
 * second) that logs and scripts can read.
 */

/** A running progress display. */
export interface Progress {
  /** `done` of the total so far. */
  update(done: number): void;
  /** Draws the last state and ends the line. */
  finish(): void;
}

/** Where progress goes: a stream, maybe a terminal. */
export interface ProgressStream {
  write(text: string): unknown;
  isTTY?: boolean;
  columns?: number;
}

const BAR_WIDTH = 30;
const TTY_REDRAW_MS = 100;
const LINE_EVERY_MS = 1000;

/**
 * Starts a progress display for `total` items.
 *
 * @example
 * const progress = startProgress(process.stderr, 'replay', 500);
 * progress.update(120); // replay [#######.......................] 120/500 24%
 * progress.finish();
 */
export function startProgress(stream: ProgressStream, label: string, total: number, now: () => number = () => performance.now()): Progress {
  let done = 0;
  let drawnAt = Number.NEGATIVE_INFINITY;
  let drawn = -1;
  const percent = () => (total > 0 ? Math.min(100, Math.floor((done / total) * 100)) : 100);
  const draw = () => {
    drawnAt = now();
    drawn = done;
    if (stream.isTTY) {
      const filled = total > 0 ? Math.min(BAR_WIDTH, Math.round((done / total) * BAR_WIDTH)) : BAR_WIDTH;
      stream.write(`\r${label} [${'#'.repeat(filled)}${'.'.repeat(BAR_WIDTH - filled)}] ${done}/${total} ${percent()}%`);
    } else {
      stream.write(`${label}: ${done}/${total} (${percent()}%)\n`);
    }
  };
  return {
    update(value) {
      done = value;
      const every = stream.isTTY ? TTY_REDRAW_MS : LINE_EVERY_MS;
      if (drawn < 0 || now() - drawnAt >= every) draw();
    },
    finish() {
      if (drawn !== done) draw();
      if (stream.isTTY && drawn >= 0) stream.write('\n');
    },
  };
}
