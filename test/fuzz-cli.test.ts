/**
 * Bad-input fuzzing of what people and scripts type and what the network
 * sends to a running `mailroom start` (issue #8): command lines run through
 * `main()` in process, config files through the loader, raw HTTP requests to
 * the metrics endpoint. Every case: an exit code the docs list and a message
 * without a stack trace, a ConfigError naming the file, an HTTP status; the
 * program and the server keep working. Seeds are fixed (test/helpers/fuzz.ts).
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import fc from 'fast-check';
import { ConfigError } from '../src/config/config-error.ts';
import { loadConfig } from '../src/config/load-config.ts';
import { startMetricsServer } from '../src/cli/metrics-server.ts';
import { main } from '../src/cli/program.ts';
import { anyString, fuzz } from './helpers/fuzz.ts';

const dir = mkdtempSync(join(tmpdir(), 'mailroom-fuzz-cli-'));
after(() => rmSync(dir, { recursive: true, force: true }));

/** A closed port: commands that get as far as the database fail at once (exit 1). */
const CLOSED_DATABASE = 'postgres://nobody@127.0.0.1:1/none';

/** Captures what a command writes. */
function capture() {
  let out = '';
  let err = '';
  const io = {
    out: { write: (chunk: string) => ((out += chunk), true), isTTY: false },
    err: { write: (chunk: string) => ((err += chunk), true), isTTY: false },
  } as unknown as Parameters<typeof main>[1];
  return { io, text: () => ({ out, err }) };
}

const COMMAND_WORDS = ['migrate', 'start', 'demo', 'doctor', 'status', 'jobs', 'dlq', 'bench', 'help', 'version', 'dashboard', 'get', 'list', 'show', 'replay', 'discard', 'statsu', 'dlqs'];
const FLAGS = [
  '--json', '--help', '-h', '--database', '--data-dir', '--schema', '--config', '--queue', '--type', '--category', '--since', '--until', '--text',
  '--id', '--all', '--limit', '--cursor', '--rate', '--dry-run', '--by', '--check', '--max-age', '--max-dead', '--max-lag', '--correlation',
  '--jobs', '--concurrency', '--latency-jobs', '--port', '--no-metrics', '--lease', '--rabbitmq', '--nats', '--redis', '--frob', '-x', '--', '-',
];
const VALUES = ['', '0', '-1', '1e9', 'NaN', '10/s', '10/x', 'ten', '2h', 'yesterday', '2026-13-45', 'null', '{}', '%', '_', "'; DROP TABLE jobs; --", 'é😀', '\u0000'];

/** Words without a path separator: no generated --data-dir or --config can reach outside the scratch directory. */
const word = fc.oneof(fc.constantFrom(...COMMAND_WORDS), fc.constantFrom(...FLAGS), fc.constantFrom(...VALUES), anyString).map((w) => w.replace(/[/\\]/g, '_').replace(/\.\./g, '_'));

describe('fuzzing the command line (main() in process)', () => {
  it('any argv: exit 0, 1, 2 or 3, a message for every failure, never a stack trace or an uncaught error', async () => {
    const cwd = process.cwd();
    const codes = new Map<number, number>();
    process.chdir(dir); // no mailroom.config.* here; an embedded database could only be made inside it
    try {
      await fuzz(
        'argv',
        fc.asyncProperty(fc.array(word, { maxLength: 6 }), async (argv) => {
          // Commands that would do real work reach a closed database port and fail fast; doctor and
          // start refuse the flag or the missing config (usage).
          const args = argv.includes('--database') || argv.includes('--data-dir') ? argv : [...argv, '--database', CLOSED_DATABASE];
          const { io, text } = capture();
          const code = await main(args, io);
          codes.set(code, (codes.get(code) ?? 0) + 1);
          const { out, err } = text();
          assert.ok([0, 1, 2, 3].includes(code), `exit ${code} for ${JSON.stringify(args)}`);
          assert.doesNotMatch(out + err, /\n\s+at .+:\d+:\d+\)?\n/, `a stack trace for ${JSON.stringify(args)}:\n${err}`);
          if (code !== 0) {
            const message = args.includes('--json') ? out : err;
            assert.ok(message.trim().length > 0, `exit ${code} without a message for ${JSON.stringify(args)}`);
            if (args.includes('--json') && out.trim().startsWith('{')) assert.doesNotThrow(() => JSON.parse(out), `--json output is JSON for ${JSON.stringify(args)}`);
          }
        }),
        150,
      );
    } finally {
      process.chdir(cwd);
    }
    // The generator reaches every outcome: help and version (0), a database that cannot be reached (1), usage (2).
    for (const code of [0, 1, 2]) assert.ok((codes.get(code) ?? 0) > 0, `no run exited ${code}: ${JSON.stringify([...codes])}`);
  });
});

describe('fuzzing config files (the loader of mailroom start and the read commands)', () => {
  const VALID = JSON.stringify({ schema: 'mailroom', queues: { email: { owner: 'growth' } }, redact: ['password'], relay: { batchSize: 100 }, metrics: { port: 9464 } }, null, 2);

  /** Loads `source` as mailroom.config.json: a config, or a ConfigError that names the file. */
  const outcomes = { loaded: 0, refused: 0, withLine: 0 };
  async function load(source: string): Promise<void> {
    const path = join(dir, 'mailroom.config.json');
    writeFileSync(path, source);
    try {
      await loadConfig(path, dir);
      outcomes.loaded++;
    } catch (error) {
      outcomes.refused++;
      assert.ok(error instanceof ConfigError, `not a ConfigError for ${JSON.stringify(source.slice(0, 200))}: ${String(error)}`);
      assert.match(error.message, /mailroom\.config\.json/, `the error names the file: ${error.message}`);
      const line = /mailroom\.config\.json:(\d+)/.exec(error.message)?.[1];
      if (line !== undefined) outcomes.withLine++;
      if (line !== undefined) assert.ok(Number(line) >= 1 && Number(line) <= source.split('\n').length + 1, `line ${line} is in the file: ${error.message}`);
    }
  }

  it('any JSON value, and the valid config cut, spliced and retyped: a config or a ConfigError naming the file (and a line in it)', async () => {
    await fuzz('config JSON values', fc.asyncProperty(fc.json({ depthSize: 'small' }), load), 150);
    const edit = fc.record({ at: fc.nat(VALID.length), cut: fc.nat(20), insert: fc.oneof(anyString, fc.constantFrom(',', '}', '{', '"', ':', '[', ']', 'null', '-1', '\n', '\u0000')) });
    await fuzz('config JSON edits', fc.asyncProperty(fc.array(edit, { minLength: 1, maxLength: 4 }), async (edits) => {
      let source = VALID;
      for (const e of edits) source = source.slice(0, e.at) + e.insert + source.slice(e.at + e.cut);
      await load(source);
    }), 200);
    assert.ok(outcomes.loaded > 0 && outcomes.refused > 0 && outcomes.withLine > 0, `the edits reach valid, refused and located outcomes: ${JSON.stringify(outcomes)}`);
  });
});

describe('fuzzing the HTTP endpoint of mailroom start', () => {
  it('odd methods, paths, headers, huge URLs and requests cut off midway: a status line or a closed connection; /metrics keeps answering', async (t) => {
    const server = await startMetricsServer({ host: '127.0.0.1', port: 0, path: '/metrics' });
    t.after(() => server.close());
    server.setSource({ metrics: () => '# TYPE up gauge\nup 1\n', metricsContentType: 'text/plain; version=0.0.4' });
    server.setHealth('running');
    const raw = (request: string, keepOpenMs = 0) =>
      new Promise<string>((resolve) => {
        const socket = connect(server.port, '127.0.0.1');
        let reply = '';
        socket.on('data', (chunk: Buffer) => (reply += chunk.toString('latin1')));
        socket.on('error', () => resolve(reply));
        socket.on('close', () => resolve(reply));
        socket.write(request, 'latin1');
        // A request cut off midway (slowloris): give up after keepOpenMs; the server must not need it.
        setTimeout(() => socket.destroy(), keepOpenMs || 300);
      });
    const statuses = new Map<string, number>();
    const method = fc.oneof(
      { arbitrary: fc.constantFrom('GET', 'HEAD'), weight: 3 },
      { arbitrary: fc.constantFrom('POST', 'PUT', 'DELETE', 'OPTIONS', 'TRACE', 'PATCH', 'BREW', 'get', ''), weight: 2 },
      { arbitrary: fc.string({ maxLength: 12 }), weight: 1 },
    );
    const path = fc.oneof(
      { arbitrary: fc.constantFrom('/metrics', '/healthz', '/metrics?x=1'), weight: 3 },
      { arbitrary: fc.constantFrom('/', '*', '/../etc/passwd', '//metrics', '/%00', '/%zz', `/${'a'.repeat(70_000)}`, 'http://evil/metrics'), weight: 2 },
      { arbitrary: fc.string({ maxLength: 40 }).map((s) => `/${s}`), weight: 1 },
    );
    const token = fc.stringMatching(/^[A-Za-z0-9-]{1,20}$/);
    const header = fc.oneof(
      { arbitrary: fc.tuple(token, fc.stringMatching(/^[\x20-\x7e]{0,60}$/)).map(([k, v]) => `X-${k}: ${v}`), weight: 3 },
      { arbitrary: fc.tuple(fc.string({ maxLength: 20 }), fc.string({ maxLength: 60 })).map(([k, v]) => `${k}: ${v}`), weight: 1 },
    );
    await fuzz(
      'http',
      fc.asyncProperty(method, path, fc.array(header, { maxLength: 4 }), fc.boolean(), async (m, p, headers, cut) => {
        const request = `${m} ${p} HTTP/1.1\r\nHost: x\r\n${headers.join('\r\n')}${headers.length ? '\r\n' : ''}\r\n`;
        const reply = await raw(cut ? request.slice(0, Math.max(1, Math.floor(request.length / 2))) : request);
        const status = /^HTTP\/1\.[01] (\d{3}) /.exec(reply)?.[1];
        statuses.set(status ?? 'none', (statuses.get(status ?? 'none') ?? 0) + 1);
        if (reply !== '') assert.match(reply, /^HTTP\/1\.[01] \d{3} /, `a status line for ${JSON.stringify(request.slice(0, 120))}`);
      }),
      120,
    );
    for (const status of ['200', '400', '404', '405']) assert.ok((statuses.get(status) ?? 0) > 0, `no reply with ${status}: ${JSON.stringify([...statuses])}`);
    const res = await fetch(server.url);
    assert.equal(res.status, 200);
    assert.equal(await res.text(), '# TYPE up gauge\nup 1\n');
  });
});
