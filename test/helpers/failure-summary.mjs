/**
 * A node:test reporter that lists the failed tests once the run is over, one
 * entry each (the file and, for JavaScript, the line; the suites above it;
 * the name; the start of the error), after the TAP totals. In a long CI log
 * only the end may be kept, and a failure reported mid-run is otherwise lost
 * with the rest. `npm test`
 * runs it beside the TAP reporter, writing to stderr:
 *
 *   node --test --test-reporter=tap --test-reporter-destination=stdout \
 *     --test-reporter=./test/helpers/failure-summary.mjs --test-reporter-destination=stderr …
 *
 * Suites and files that failed only because a test in them did are left out.
 */
import { relative } from 'node:path';

/** Files that tsx compiles: node reports a line of the compiled code (line 1), so none is printed. */
const TYPESCRIPT = /\.[cm]?tsx?$/;

export default async function* failureSummary(source) {
  /** Per file, the names of the tests started at each nesting level (the current path). */
  const paths = new Map();
  const failed = [];
  for await (const event of source) {
    const data = event.data;
    if (event.type === 'test:start') {
      const path = paths.get(data.file) ?? [];
      path.length = data.nesting;
      path.push(data.name);
      paths.set(data.file, path);
    } else if (event.type === 'test:fail') {
      const error = data.details?.error;
      const cause = error?.cause ?? error;
      if (error?.failureType === 'subtestsFailed') continue;
      const above = (paths.get(data.file) ?? []).slice(0, data.nesting);
      failed.push({ where: `${data.file ? relative(process.cwd(), data.file) : '?'}${data.line && !TYPESCRIPT.test(data.file ?? '') ? `:${data.line}` : ''}`, name: [...above, data.name].join(' > '), message: oneLine(cause) });
    }
  }
  if (failed.length === 0) return;
  yield `\ntests that failed or were cancelled (${failed.length}):\n`;
  for (const f of failed) yield `  ${f.where}  ${f.name}\n    ${f.message}\n`;
}

function oneLine(error) {
  const text = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  const line = text.replace(/\s+/g, ' ').trim();
  return line.length > 400 ? `${line.slice(0, 400)}…` : line;
}
