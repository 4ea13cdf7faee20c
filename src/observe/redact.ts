/**
 * Redaction of payload fields named in config (`createMailroom({ redact })`),
 * applied to every output that shows a payload: dead letters, `jobs.get`,
 * the command line.
 */

/** What a redacted value is replaced with. */
export const REDACTED = '[redacted]';

/** Checks the `redact` option: dot paths such as `password` or `card.number`. */
export function checkRedactPaths(paths: unknown): string[] {
  if (paths === undefined) return [];
  if (!Array.isArray(paths)) throw new TypeError(`redact must be an array of field paths such as ['password', 'card.number'], got ${typeof paths}`);
  for (const [i, path] of paths.entries()) {
    if (typeof path !== 'string' || path === '' || path.split('.').some((part) => part === '')) {
      throw new TypeError(`redact[${i}] must be a dot path such as 'card.number', got ${JSON.stringify(path)}`);
    }
  }
  return paths as string[];
}

/**
 * A copy of `value` with the fields at `paths` replaced by `[redacted]`. A
 * path matches at any depth of arrays: `items.card` redacts `card` in each item.
 * A name without dots (`password`) matches that field anywhere in the payload.
 *
 * @example
 * redact({ user: { password: 'x' } }, ['password']); // { user: { password: '[redacted]' } }
 */
export function redact(value: unknown, paths: readonly string[]): unknown {
  if (paths.length === 0) return value;
  const anywhere = new Set(paths.filter((p) => !p.includes('.')));
  const exact = paths.filter((p) => p.includes('.')).map((p) => p.split('.'));
  return walk(value, [], anywhere, exact);
}

function walk(value: unknown, at: string[], anywhere: Set<string>, exact: string[][]): unknown {
  if (Array.isArray(value)) return value.map((item) => walk(item, at, anywhere, exact));
  if (value === null || typeof value !== 'object') return value;
  const out: Record<string, unknown> = {};
  for (const [key, child] of Object.entries(value as Record<string, unknown>)) {
    const path = [...at, key];
    const hidden = anywhere.has(key) || exact.some((p) => p.length === path.length && p.every((part, i) => part === path[i]));
    out[key] = hidden ? REDACTED : walk(child, path, anywhere, exact);
  }
  return out;
}
