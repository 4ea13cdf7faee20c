/**
 * A strict JSON scanner for config files: it finds where a syntax error is
 * (JSON.parse does not always say: "Unexpected token ..." has no position on
 * Node 20) and where each key of a valid document starts, so errors can name
 * the line.
 */
import { childPath } from './key-path.ts';

/** A JSON syntax error at `offset` of the text. */
export class JsonSyntaxError extends Error {
  override name = 'JsonSyntaxError';
  constructor(
    message: string,
    readonly offset: number,
  ) {
    super(message);
  }
}

const WHITESPACE = new Set([' ', '\t', '\n', '\r']);
const ESCAPES = new Set(['"', '\\', '/', 'b', 'f', 'n', 'r', 't']);
const NUMBER = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;

function describe(ch: string | undefined): string {
  return ch === undefined ? 'the end of the file' : `${JSON.stringify(ch)}`;
}

/**
 * Checks `text` as JSON and returns the offset of every key (objects) and
 * element (arrays) by key path (`workers[0].concurrency`). Throws a
 * {@link JsonSyntaxError} at the first mistake.
 *
 * @example
 * scanJson('{\n  "schema": "app"\n}').get('schema') // 4
 */
export function scanJson(text: string): Map<string, number> {
  const offsets = new Map<string, number>();
  let i = 0;
  const fail = (message: string, at = i): never => {
    throw new JsonSyntaxError(message, at);
  };
  const skip = () => {
    while (i < text.length && WHITESPACE.has(text[i]!)) i++;
  };
  const string = (): string => {
    const start = i;
    i++; // opening quote
    for (;;) {
      const ch = text[i];
      if (ch === undefined) fail('unterminated string (no closing ")', start);
      if (ch === '"') break;
      if (ch! < ' ') fail(`a control character (${JSON.stringify(ch)}) inside a string; write it as an escape such as \\n`);
      if (ch === '\\') {
        const next = text[i + 1];
        if (next === 'u') {
          if (!/^[0-9a-fA-F]{4}$/.test(text.slice(i + 2, i + 6))) fail('\\u must be followed by four hex digits');
          i += 6;
          continue;
        }
        if (next === undefined || !ESCAPES.has(next)) fail(`unknown escape \\${next ?? ''} in a string`);
        i += 2;
        continue;
      }
      i++;
    }
    i++; // closing quote
    return JSON.parse(text.slice(start, i)) as string;
  };
  const value = (path: string): void => {
    skip();
    const ch = text[i];
    if (ch === '{') {
      i++;
      skip();
      if (text[i] === '}') {
        i++;
        return;
      }
      for (;;) {
        skip();
        if (text[i] !== '"') {
          fail(text[i] === '}' ? "expected a key after ',' (a trailing comma before '}' is not allowed in JSON)" : `expected a double-quoted key, found ${describe(text[i])}`);
        }
        const keyAt = i;
        const key = string();
        const child = childPath(path, key);
        offsets.set(child, keyAt);
        skip();
        if (text[i] !== ':') fail(`expected ':' after the key ${JSON.stringify(key)}, found ${describe(text[i])}`);
        i++;
        value(child);
        skip();
        if (text[i] === ',') {
          i++;
          continue;
        }
        if (text[i] === '}') {
          i++;
          return;
        }
        fail(`expected ',' or '}' after the value of ${JSON.stringify(key)}, found ${describe(text[i])}`);
      }
    }
    if (ch === '[') {
      i++;
      skip();
      if (text[i] === ']') {
        i++;
        return;
      }
      for (let n = 0; ; n++) {
        skip();
        if (text[i] === ']') fail("expected a value after ',' (a trailing comma before ']' is not allowed in JSON)");
        const child = `${path}[${n}]`;
        offsets.set(child, i);
        value(child);
        skip();
        if (text[i] === ',') {
          i++;
          continue;
        }
        if (text[i] === ']') {
          i++;
          return;
        }
        fail(`expected ',' or ']' after an element, found ${describe(text[i])}`);
      }
    }
    if (ch === '"') {
      string();
      return;
    }
    for (const word of ['true', 'false', 'null']) {
      if (text.startsWith(word, i)) {
        i += word.length;
        return;
      }
    }
    NUMBER.lastIndex = i;
    const number = NUMBER.exec(text);
    if (number && number[0] !== '-' && number[0].length > 0) {
      i += number[0].length;
      return;
    }
    if (ch === "'") fail("strings and keys take double quotes in JSON, not '");
    fail(`expected a value (an object, array, string, number, true, false or null), found ${describe(ch)}`);
  };
  value('');
  skip();
  if (i < text.length) fail(`unexpected ${describe(text[i])} after the end of the document`);
  return offsets;
}
