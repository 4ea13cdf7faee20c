/**
 * Key paths of a config (`workers[0].concurrency`) and where a key appears in
 * the config's source text, so that an error can name the line.
 */

const IDENTIFIER = /^[A-Za-z_$][\w$]*$/;

/**
 * The path of `key` inside the value at `path`: `workers[0]` + `concurrency`
 * → `workers[0].concurrency`; a key that is not an identifier is quoted
 * (`queues["billing.eu"]`).
 *
 * @example
 * childPath('metrics', 'port') // 'metrics.port'
 */
export function childPath(path: string, key: string | number): string {
  if (typeof key === 'number') return `${path}[${key}]`;
  if (IDENTIFIER.test(key)) return path === '' ? key : `${path}.${key}`;
  return `${path}[${JSON.stringify(key)}]`;
}

type Segment = string | number;

/** `workers[0].handlers["a.b"]` → ['workers', 0, 'handlers', 'a.b']. */
export function pathSegments(path: string): Segment[] {
  const segments: Segment[] = [];
  const pattern = /([A-Za-z_$][\w$]*)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]/g;
  for (const match of path.matchAll(pattern)) {
    if (match[1] !== undefined) segments.push(match[1]);
    else if (match[2] !== undefined) segments.push(Number(match[2]));
    else if (match[3] !== undefined) segments.push(JSON.parse(match[3]) as string);
  }
  return segments;
}

/** 1-based line and column of `offset` in `text`. */
export function lineColumn(text: string, offset: number): { line: number; column: number } {
  let line = 1;
  let lineStart = 0;
  const end = Math.min(Math.max(0, offset), text.length);
  for (let i = 0; i < end; i++) {
    if (text.charCodeAt(i) === 10) {
      line++;
      lineStart = i + 1;
    }
  }
  return { line, column: end - lineStart + 1 };
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/** Offsets where `key` is written as a property key (`key:`, `'key':`, `"key":`) from `from` on. */
function keyOffsets(source: string, key: string, from: number): number[] {
  const pattern = new RegExp(`(?<![\\w$])(["'\`]?)${escapeRegExp(key)}\\1\\s*:`, 'g');
  pattern.lastIndex = from;
  const found: number[] = [];
  for (let match = pattern.exec(source); match; match = pattern.exec(source)) found.push(match.index);
  return found;
}

/**
 * Best-effort line of a key path in the source of a code config: each key is
 * looked for after the previous one (`workers[1].concurrency`: the second
 * `concurrency:` after `workers:`), falling back to anywhere in the file and
 * then to the line of the nearest enclosing key. Undefined when no key of the
 * path is written out (e.g. built by a function elsewhere).
 *
 * @example
 * findKeyLine('export default {\n  workers: [{ concurrency: 0 }],\n};', 'workers[0].concurrency') // 2
 */
export function findKeyLine(source: string, path: string): number | undefined {
  let position = 0;
  let found: number | undefined;
  let skip = 0;
  for (const segment of pathSegments(path)) {
    if (typeof segment === 'number') {
      skip = segment;
      continue;
    }
    const after = keyOffsets(source, segment, position);
    let at = after[skip] ?? after[0];
    if (at === undefined) at = keyOffsets(source, segment, 0)[0];
    skip = 0;
    if (at === undefined) break;
    found = at;
    position = at;
  }
  return found === undefined ? undefined : lineColumn(source, found).line;
}

/**
 * Exact line of a key path in a JSON config, from the key offsets of
 * `scanJson`; the nearest enclosing key when the key itself is absent.
 */
export function jsonKeyLine(source: string, offsets: ReadonlyMap<string, number>, path: string): number | undefined {
  for (let p = path; p !== ''; p = parentPath(p)) {
    const at = offsets.get(p);
    if (at !== undefined) return lineColumn(source, at).line;
  }
  return undefined;
}

function parentPath(path: string): string {
  const cut = Math.max(path.lastIndexOf('.'), path.lastIndexOf('['));
  return cut <= 0 ? '' : path.slice(0, cut);
}
