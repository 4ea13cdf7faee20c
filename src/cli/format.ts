/** Text for people: aligned tables, ages and times. */

/** One column of {@link table}: its heading and whether numbers align right. */
export interface Column {
  heading: string;
  right?: boolean;
}

/**
 * Lays rows out under their headings, columns two spaces apart, indented by two.
 *
 * @example
 * table([{ heading: 'queue' }, { heading: 'dead', right: true }], [['email', '2']])
 * // '  queue  dead\n  email     2\n'
 */
export function table(columns: readonly Column[], rows: readonly (readonly string[])[]): string {
  const widths = columns.map((c, i) => Math.max(c.heading.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: readonly string[]) =>
    `  ${columns
      .map((c, i) => (c.right ? (cells[i] ?? '').padStart(widths[i]!) : (cells[i] ?? '').padEnd(widths[i]!)))
      .join('  ')
      .trimEnd()}\n`;
  return line(columns.map((c) => c.heading)) + rows.map(line).join('');
}

/**
 * A duration in seconds, short: `0s`, `1.5s`, `42s`, `5m`, `3m 05s`, `2h 03m`, `1d 04h`.
 *
 * @example
 * formatAge(185) // '3m 05s'
 */
export function formatAge(seconds: number): string {
  if (seconds > 0 && seconds < 10 && !Number.isInteger(seconds)) return `${Math.round(seconds * 10) / 10}s`;
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  const pad = (n: number) => String(n).padStart(2, '0');
  const two = (big: number, bigUnit: string, small: number, smallUnit: string) => (small === 0 ? `${big}${bigUnit}` : `${big}${bigUnit} ${pad(small)}${smallUnit}`);
  if (s < 3600) return two(Math.floor(s / 60), 'm', s % 60, 's');
  if (s < 86_400) return two(Math.floor(s / 3600), 'h', Math.floor((s % 3600) / 60), 'm');
  return two(Math.floor(s / 86_400), 'd', Math.floor((s % 86_400) / 3600), 'h');
}

/** A rate per second with up to three decimals (`0`, `0.05`, `12.5`). */
export function formatRate(perSecond: number): string {
  return String(Math.round(perSecond * 1000) / 1000);
}

/** A time as ISO 8601 in UTC, or `-`. */
export function formatTime(at: Date | string | null | undefined): string {
  if (at === null || at === undefined) return '-';
  const date = at instanceof Date ? at : new Date(at);
  return Number.isNaN(date.getTime()) ? String(at) : date.toISOString();
}
