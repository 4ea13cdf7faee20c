/**
 * A small reader of the Prometheus text exposition format, for tests: sample
 * lines (`name{label="value",...} value`) and `# TYPE` lines.
 */

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface Exposition {
  samples: Sample[];
  /** Metric family name → its type (counter, gauge, histogram, summary). */
  types: Map<string, string>;
}

const LINE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?$/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*/y;

function number(text: string): number {
  if (text === '+Inf') return Infinity;
  if (text === '-Inf') return -Infinity;
  if (text === 'NaN' || text === 'Nan') return NaN; // prom-client writes Nan
  const value = Number(text);
  if (Number.isNaN(value)) throw new Error(`not a sample value: ${text}`);
  return value;
}

function labels(text: string | undefined, line: string): Record<string, string> {
  const result: Record<string, string> = {};
  if (!text) return result;
  LABEL.lastIndex = 0;
  while (LABEL.lastIndex < text.length) {
    const m = LABEL.exec(text);
    if (!m) throw new Error(`malformed labels in: ${line}`);
    result[m[1]!] = m[2]!.replace(/\\(["\\n])/g, (_, c: string) => (c === 'n' ? '\n' : c));
  }
  return result;
}

/** Parses an exposition; throws on a line it cannot read. */
export function parseExposition(text: string): Exposition {
  const samples: Sample[] = [];
  const types = new Map<string, string>();
  for (const line of text.split('\n')) {
    if (line.trim() === '') continue;
    if (line.startsWith('#')) {
      const type = /^# TYPE (\S+) (\S+)$/.exec(line);
      if (type) types.set(type[1]!, type[2]!);
      continue;
    }
    const m = LINE.exec(line);
    if (!m) throw new Error(`not an exposition line: ${line}`);
    samples.push({ name: m[1]!, labels: labels(m[2], line), value: number(m[3]!) });
  }
  return { samples, types };
}

/** The samples of `name` whose labels include all of `match`. */
export function select(exposition: Exposition, name: string, match: Record<string, string> = {}): Sample[] {
  return exposition.samples.filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v));
}

/** The value of the one sample of `name` matching `match`; throws naming what exists when there is not exactly one. */
export function valueOf(exposition: Exposition, name: string, match: Record<string, string> = {}): number {
  const found = select(exposition, name, match);
  if (found.length !== 1) {
    const all = exposition.samples.filter((s) => s.name === name).map((s) => JSON.stringify(s.labels) + ' ' + s.value);
    throw new Error(`${found.length} samples of ${name} match ${JSON.stringify(match)}; there are: ${all.join('; ') || 'none'}`);
  }
  return found[0]!.value;
}

/**
 * Every sample name the exposition can carry: each family, and for histograms
 * and summaries their `_bucket`, `_sum`, `_count` series.
 */
export function seriesNames(exposition: Exposition): Set<string> {
  const names = new Set<string>();
  for (const [name, type] of exposition.types) {
    names.add(name);
    if (type === 'histogram') for (const suffix of ['_bucket', '_sum', '_count']) names.add(name + suffix);
    if (type === 'summary') for (const suffix of ['_sum', '_count']) names.add(name + suffix);
  }
  return names;
}
