/**
 * Guarantee 6: bad input gets a clear error and loses nothing. Each case
 * asserts the error class, that the message names the problem (the limit, the
 * field, the option), and that the jobs table of the test's schema holds
 * exactly what it held before. Plus: a job type no handler exists for is
 * dead-lettered as `unknown-type` after one attempt, not retried.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { z } from 'zod';
import { createMailroom, defineEvent, defineJob, MailroomError, ValidationError, type JobDefinition } from '../src/index.ts';
import { databaseUrl, testDatabases, type TestMailroom } from './helpers/databases.ts';
import { ConfigProblem } from '../src/config/config-error.ts';
import { validateConfig } from '../src/config/validate-config.ts';
import { resolveStallCheck } from '../src/storage/stall-check-options.ts';
import { waitForEvents } from './helpers/events.ts';

const INJECTIONS = [`x"; DROP TABLE jobs; --`, `'; DELETE FROM jobs; --`, `jobs; TRUNCATE jobs`, `a" OR "1"="1`];
const BAD_NAMES = ['', `it's`, 'say "hi"', 'a;b', 'with space', 'x'.repeat(129), '.dot-first', 'new\nline', ...INJECTIONS];
const BAD_SCHEMAS = ['', 'Upper', '1starts_with_digit', `it's`, 'a"b', 'a;b', 'a-b', 'x'.repeat(51), ...INJECTIONS];

let seq = 0;
/** A job type with a name no other test uses (the registry is per process). */
function uniqueJob<T = unknown>(options: Parameters<typeof defineJob>[1] = {}): JobDefinition<T, T> {
  return defineJob<T>(`bad.input.${process.pid}.${seq++}`, options as never);
}

async function jobCount(t: TestMailroom): Promise<number> {
  const [row] = await t.sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${t.schema}".jobs`);
  return row!.n;
}

/** Opens a schema holding one good job, so "unchanged" means something. */
async function openWithOneJob(db: ReturnType<typeof testDatabases>[number], options: Parameters<typeof db.open>[0] = {}) {
  const t = await db.open(options);
  await t.mailroom.enqueue(uniqueJob(), { good: true });
  assert.equal(await jobCount(t), 1);
  return t;
}

/**
 * Runs `action`, expects it to fail with `errorClass` and a message matching
 * every pattern, and checks that nothing was written.
 */
async function refused(
  t: TestMailroom,
  action: () => unknown,
  patterns: RegExp[],
  errorClass: new (...args: never[]) => Error = ValidationError,
): Promise<Error> {
  const before = await jobCount(t);
  let caught: unknown;
  try {
    await action();
  } catch (error) {
    caught = error;
  }
  assert.ok(caught !== undefined, `expected an error matching ${patterns.join(', ')}; nothing was thrown`);
  assert.ok(caught instanceof errorClass, `expected ${errorClass.name}, got ${String(caught)}`);
  for (const p of patterns) assert.match(caught.message, p);
  assert.equal(await jobCount(t), before, `nothing written after: ${caught.message}`);
  return caught;
}

test('createMailroom checks every option before it opens anything: a bad redact, logger, queues, rescueInterval or stallCheck leaves no embedded database behind', async () => {
  const cwd = process.cwd();
  const dir = mkdtempSync(join(tmpdir(), 'mailroom-options-'));
  const saved = process.env.DATABASE_URL;
  delete process.env.DATABASE_URL; // the embedded default, in ./.mailroom of this directory
  process.chdir(dir);
  try {
    const cases: [Parameters<typeof createMailroom>[0], RegExp][] = [
      [{ redact: ['card..number'] }, /redact\[0\] must be a dot path/],
      [{ redact: 'password' as never }, /redact must be an array of field paths/],
      [{ logger: { info() {} } as never }, /logger must have error, warn methods/],
      [{ queues: { email: { owner: 7 } } as never }, /queues\.email\.owner must be the owning team's name/],
      [{ queues: ['email'] as never }, /queues must be an object of queue name -> settings; got an array|queues must be an object/],
      [{ rescueInterval: 'soon' as never }, /rescueInterval: "soon" is not a duration/],
      [{ stallCheck: { after: 'soon' as never } }, /stallCheck\.after: "soon" is not a duration/],
      [{ stallCheck: { every: 0 } }, /stallCheck\.every: must be above 0, got 0; to switch the check off, pass stallCheck: false/],
      [{ stallCheck: { aftr: '5s' } as never }, /stallCheck: unknown option "aftr"; did you mean "after"\?/],
      [{ stallCheck: true as never }, /stallCheck: expected \{ after, every, answer \} \(durations\) or false, got boolean/],
      [{ database: '' }, /database: got an empty string \(is DATABASE_URL set but empty\?\); give a postgres:\/\/ URL, or leave it unset/],
    ];
    for (const [options, message] of cases) {
      await assert.rejects(createMailroom(options), message);
      assert.equal(existsSync(join(dir, '.mailroom')), false, `no embedded database made for ${JSON.stringify(options)}`);
    }
    // A DATABASE_URL set but empty (a deployment that lost its value) never opens a local database.
    process.env.DATABASE_URL = '';
    await assert.rejects(createMailroom(), /database: got an empty string from DATABASE_URL; give a postgres/);
    delete process.env.DATABASE_URL;
    assert.equal(existsSync(join(dir, '.mailroom')), false);
  } finally {
    process.chdir(cwd);
    if (saved !== undefined) process.env.DATABASE_URL = saved;
    rmSync(dir, { recursive: true, force: true });
  }
});

test('stallCheck: defaults filled in, false never gives up on a statement, and a config file is checked the same way', () => {
  assert.deepEqual(resolveStallCheck(undefined), { afterMs: 15_000, everyMs: 5_000, answerMs: 10_000 });
  assert.deepEqual(resolveStallCheck({ after: '5s' }), { afterMs: 5_000, everyMs: 5_000, answerMs: 10_000 });
  const off = resolveStallCheck(false);
  assert.equal(off.afterMs, Number.POSITIVE_INFINITY);
  assert.equal(off.answerMs, Number.POSITIVE_INFINITY);
  assert.throws(() => validateConfig({ stallCheck: { answer: '-1s' } }, 'json'), (error: unknown) => {
    assert.ok(error instanceof ConfigProblem, String(error));
    assert.equal(error.path, 'stallCheck.answer');
    return true;
  });
  assert.deepEqual(validateConfig({ stallCheck: false }, 'json').stallCheck, false);
});

test('a server that cannot be reached, a database that does not exist: the error names the server (without the password) and what to check', async () => {
  const refused = await createMailroom({ database: 'postgres://app:s3cret@127.0.0.1:1/shop' });
  try {
    await assert.rejects(refused.migrate(), (e: unknown) => {
      assert.ok(e instanceof MailroomError);
      assert.match(e.message, /^cannot reach PostgreSQL at postgres:\/\/app@127\.0\.0\.1:1\/shop: connect ECONNREFUSED 127\.0\.0\.1:1\. Check the host and port in the database URL \(the `database` option or DATABASE_URL\)/);
      assert.doesNotMatch(e.message, /s3cret/);
      return true;
    });
    await assert.rejects(refused.stats(), /cannot reach PostgreSQL at postgres:\/\/app@127\.0\.0\.1:1\/shop/);
  } finally {
    await refused.close();
  }
  // node-postgres reads a password from the query string too: it is left out as well.
  const inQuery = await createMailroom({ database: 'postgres://app@127.0.0.1:1/shop?password=s3cret&sslpassword=t0p' });
  try {
    await assert.rejects(inQuery.migrate(), (e: unknown) => e instanceof Error && /at postgres:\/\/app@127\.0\.0\.1:1\/shop:/.test(e.message) && !/s3cret|t0p/.test(e.message));
  } finally {
    await inQuery.close();
  }
  if (databaseUrl === undefined) return;
  const url = new URL(databaseUrl);
  url.pathname = '/mailroom_no_such_db';
  const missing = await createMailroom({ database: url.toString() });
  try {
    await assert.rejects(missing.migrate(), /database "mailroom_no_such_db" does not exist at postgres:\/\/.*\/mailroom_no_such_db: create it/);
  } finally {
    await missing.close();
  }
});

for (const db of testDatabases()) {
  describe(`bad input on ${db.name}`, () => {
    test('an option name that is not an option (a typo) is refused, naming it and the nearest one, not ignored', async () => {
      const t = await openWithOneJob(db);
      const { mailroom } = t;
      const job = uniqueJob();
      const event = defineEvent(`bad.input-${process.pid}-typo.happened`, { version: 1 });
      const handlers = { [job.name]: () => {} };
      await refused(t, () => mailroom.enqueue(job, { n: 1 }, { orderKey: 'a' } as never), [/^enqueue bad\.input\.\d+\.\d+: unknown option "orderKey"; did you mean "orderingKey"\?/]);
      await refused(t, () => mailroom.enqueueMany(job, [{ n: 1 }], { delays: '1s' } as never), [/unknown option "delays"; did you mean "delay"\?/]);
      await refused(t, () => mailroom.worker({ queue: ['q'], handlers } as never), [/^worker: unknown option "queue"; did you mean "queues"\? \(options: queues, handlers, /]);
      await refused(t, () => mailroom.relay({ batchsize: 10 } as never), [/^relay: unknown option "batchsize"; did you mean "batchSize"\?/]);
      await refused(t, () => mailroom.consumer({ group: 'g', handlers: {}, fromm: 'now' } as never), [/^consumer: unknown option "fromm"; did you mean "from"\?/]);
      await refused(t, () => mailroom.publish(event, {}, { correlationID: 'x' } as never), [/^publish: unknown option "correlationID"; did you mean "correlationId"\?/]);
      await refused(t, () => createMailroom({ dataDir: './x' } as never), [/^createMailroom: unknown option "dataDir"/]);
      const [row] = await t.sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${t.schema}".outbox`);
      assert.equal(row!.n, 0, 'no event written');
    });

    test('a stop timeout that is not a duration is refused, naming it, and leaves the worker, group and relay running', async () => {
      const t = await openWithOneJob(db);
      const { mailroom } = t;
      const job = uniqueJob();
      const event = defineEvent(`bad.input-${process.pid}-stop.happened`, { version: 1 });
      let handled = 0;
      const worker = mailroom.worker({ queues: [job.queue], handlers: { [job.name]: () => {} } });
      const consumer = mailroom.consumer({ group: `bad-stop-${process.pid}`, handlers: { [event.type]: () => void handled++ } });
      const relay = mailroom.relay({ pollInterval: 50 });
      await worker.start();
      await consumer.start();
      await relay.start();
      for (const bad of ['soon', -1, Number.NaN]) {
        await refused(t, () => worker.stop({ timeout: bad } as never), [/^stop timeout: /]);
        await refused(t, () => consumer.stop({ timeout: bad } as never), [/^stop timeout: /]);
        await refused(t, () => relay.stop({ timeout: bad } as never), [/^stop timeout: /]);
      }
      // Still running: a job enqueued now is done, an event published now is relayed and handled.
      const done = waitForEvents(worker, 'completed', 1);
      await mailroom.enqueue(job, { n: 2 });
      await done;
      await mailroom.publish(event, {});
      const deadline = Date.now() + 10_000;
      while (handled === 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 20));
      assert.equal(handled, 1, 'the relay and the group still ran after the refused stops');
      await relay.stop({ timeout: '5s' });
      await consumer.stop({ timeout: '5s' });
      await worker.stop({ timeout: '5s' });
    });

    test('a relay batchSize that is not an integer from 1 to 10000 is refused, naming it; left out or null, the default', async () => {
      const t = await openWithOneJob(db);
      const { mailroom } = t;
      for (const bad of [0, 1.5, 10_001, '100', Number.NaN]) {
        await refused(t, () => mailroom.relay({ batchSize: bad } as never), [/^relay: batchSize must be an integer from 1 to 10000, got /]);
      }
      for (const fine of [undefined, null]) {
        const relay = mailroom.relay({ internal: false, to: [{ name: `sizes-${String(fine)}`, publish: async () => {} }], batchSize: fine } as never);
        await relay.stop();
      }
    });

    test('a handler named nearly like a job of the worker\'s queues, but not like any defined job, gets a process warning naming the job', async () => {
      const { mailroom } = await db.open();
      const job = defineJob(`bad.welcome-${db.name}.send`, { queue: `typo-${db.name}` });
      const warnings: Error[] = [];
      const on = (warning: Error & { code?: string }) => void (warning.code === 'MAILROOM_HANDLER_NAME' && warnings.push(warning));
      process.on('warning', on);
      try {
        mailroom.worker({ queues: [job.queue], handlers: { [`bad.welcome-${db.name}.sent`]: () => {} } });
        mailroom.worker({ queues: [job.queue], handlers: { [job.name]: () => {} } }); // right: nothing to say
        mailroom.worker({ queues: ['elsewhere'], handlers: { [`bad.welcome-${db.name}.sent`]: () => {} } }); // not its queue: nothing to say
        await new Promise((resolve) => setImmediate(resolve)); // warnings are emitted on the next tick
      } finally {
        process.off('warning', on);
      }
      assert.equal(warnings.length, 1, warnings.map((w) => w.message).join(' | '));
      assert.match(warnings[0]!.message, new RegExp(`^worker: no job type "bad\\.welcome-${db.name}\\.sent" is defined in this process; did you mean "bad\\.welcome-${db.name}\\.send"\\? .*dead-lettered as unknown-type`));
    });

    test('a payload that is not JSON-serialisable (BigInt, a cycle, a function) is refused', async () => {
      const t = await openWithOneJob(db);
      const job = uniqueJob();
      await refused(t, () => t.mailroom.enqueue(job, { amount: 10n }), [/not JSON-serialisable/, /BigInt/, new RegExp(job.name.replaceAll('.', '\\.'))]);
      const cycle: Record<string, unknown> = { name: 'loop' };
      cycle.self = cycle;
      await refused(t, () => t.mailroom.enqueue(job, cycle), [/not JSON-serialisable/, /circular/]);
      await refused(t, () => t.mailroom.enqueue(job, () => 'fn'), [/not JSON-serialisable/]);
    });

    test('a tx that is no transaction (0, an empty string, false) is refused, not ignored; headers that are a Map are refused, not read as none', async () => {
      const t = await db.open();
      const job = defineJob('bad.tx', { queue: 'bad-tx' });
      const ev = defineEvent<{ n: number }>('bad.tx-noted', { version: 1 });
      for (const tx of [0, '', false]) {
        await assert.rejects(t.mailroom.enqueue(job, {}, { tx: tx as never }), /tx must be a node-postgres client .*; got (number|string|boolean)/);
        await assert.rejects(t.mailroom.publish(ev, { n: 1 }, { tx: tx as never }), /tx must be a node-postgres client/);
      }
      await assert.rejects(t.mailroom.publish(ev, { n: 1 }, { headers: new Map([['tenant', 'a']]) as never }), (error: unknown) => {
        assert.ok(error instanceof ValidationError);
        assert.match(error.message, /headers must be a plain object .* got a Map \(use a plain object, e\.g\. Object\.fromEntries\(map\)\)/);
        return true;
      });
      assert.equal(await jobCount(t), 0, 'no job written');
      const [outbox] = await t.sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${t.schema}".outbox`);
      assert.equal(outbox!.n, 0, 'no event written');
      // null still means "no transaction".
      await t.mailroom.enqueue(job, {}, { tx: null as never });
      assert.equal(await jobCount(t), 1);
    });

    test('a payload over the default 1 MiB limit is refused, naming the limit; one just under it is accepted', async () => {
      const t = await openWithOneJob(db);
      const job = uniqueJob();
      const overhead = JSON.stringify({ blob: '' }).length;
      const error = await refused(t, () => t.mailroom.enqueue(job, { blob: 'x'.repeat(1024 * 1024 - overhead + 1) }), [
        /over the limit of 1048576 bytes/,
        /maxPayloadBytes/,
        /1048577 bytes/,
      ]);
      assert.deepEqual((error as ValidationError).issues.map((i) => i.path), ['data']);
      await t.mailroom.enqueue(job, { blob: 'x'.repeat(1024 * 1024 - overhead) });
      assert.equal(await jobCount(t), 2, 'exactly at the limit is accepted');
    });

    test('a configured maxPayloadBytes is enforced and named; a bad setting is refused', async () => {
      const t = await openWithOneJob(db, { maxPayloadBytes: 1000 });
      const job = uniqueJob();
      await refused(t, () => t.mailroom.enqueue(job, { text: 'é'.repeat(500) }), [/over the limit of 1000 bytes/, /maxPayloadBytes/]);
      await t.mailroom.enqueue(job, { text: 'é'.repeat(400) });
      assert.equal(await jobCount(t), 2);
      const handle = await db.handle();
      for (const maxPayloadBytes of [0, -1, 1.5, Number.NaN]) {
        await refused(t, () => createMailroom({ database: handle, schema: t.schema, maxPayloadBytes }), [/maxPayloadBytes/, /positive integer/]);
      }
    });

    test('a schema-invalid payload (zod) is refused with every failing field named', async () => {
      const t = await openWithOneJob(db);
      const job = defineJob(`bad.input.zod.${seq++}`, {
        schema: z.object({ email: z.email(), age: z.number().int().min(0), address: z.object({ zip: z.string().length(5) }) }),
      });
      const error = (await refused(t, () => t.mailroom.enqueue(job, { email: 'not-an-email', age: -1, address: { zip: 12345 } } as never), [
        /invalid payload/,
        /data\.email/,
        /data\.age/,
        /data\.address\.zip/,
      ])) as ValidationError;
      assert.deepEqual(error.issues.map((i) => i.path).sort(), ['data.address.zip', 'data.age', 'data.email']);
      await refused(t, () => t.mailroom.enqueue(job, undefined as never), [/invalid payload/]);
      await refused(t, () => t.mailroom.enqueue(job, 'a string' as never), [/invalid payload/]);
      // Types catch the above at compile time; the checks are for JavaScript callers and untyped data.
      // The valid payload goes in.
      await t.mailroom.enqueue(job, { email: 'a@example.com', age: 3, address: { zip: '12345' } });
      assert.equal(await jobCount(t), 2);
    });

    test('invalid job and queue names are refused by defineJob, and nothing reaches SQL', async () => {
      const t = await openWithOneJob(db);
      for (const name of BAD_NAMES) {
        await refused(t, () => defineJob(name), [/^job name:/, /is not valid/, /1-128 characters/]);
        await refused(t, () => defineJob(`ok.${seq++}`, { queue: name }), [/queue of job/, /is not valid/]);
      }
      for (const name of [42, null, undefined, {}]) await refused(t, () => defineJob(name as never), [/^job name:/]);
    });

    test('invalid schema names are refused by createMailroom before any SQL runs', async () => {
      const t = await openWithOneJob(db);
      const handle = await db.handle();
      const schemasBefore = await t.sql<{ n: number }>('SELECT count(*)::int AS n FROM pg_namespace');
      for (const schema of BAD_SCHEMAS) {
        await refused(t, () => createMailroom({ database: handle, schema }), [/^schema:/, /not a valid schema name/, /1-50 lower-case/]);
      }
      assert.deepEqual(await t.sql('SELECT count(*)::int AS n FROM pg_namespace'), schemasBefore, 'no schema was created');
      assert.deepEqual(await t.sql(`SELECT count(*)::int AS n FROM pg_namespace WHERE nspname LIKE '%DROP%' OR nspname LIKE '%;%'`), [{ n: 0 }]);
    });

    test('invalid queue names are refused by worker({ queues })', async () => {
      const t = await openWithOneJob(db);
      for (const queue of BAD_NAMES) {
        await refused(t, () => t.mailroom.worker({ queues: ['ok', queue], handlers: {} }), [/^worker queue:/, /is not valid/]);
      }
      await refused(t, () => t.mailroom.worker({ queues: [], handlers: {} }), [/queues must be a non-empty array/]);
      await refused(t, () => t.mailroom.worker({ queues: ['q'], concurrency: 0, handlers: {} }), [/concurrency must be an integer from 1/]);
      await refused(t, () => t.mailroom.worker({ queues: ['q'], lease: 5, handlers: {} }), [/lease must be at least 100ms/]);
    });

    test('names with SQL in them never change the database: the jobs table and its rows survive', async () => {
      const t = await openWithOneJob(db);
      const handle = await db.handle();
      for (const name of INJECTIONS) {
        await refused(t, () => defineJob(name), [/not valid/]);
        await refused(t, () => createMailroom({ database: handle, schema: name }), [/not a valid schema name/]);
      }
      // Values (not names) carrying SQL are just data.
      const job = uniqueJob();
      const id = await t.mailroom.enqueue(job, { note: INJECTIONS[0] }, { key: INJECTIONS[1], correlationId: INJECTIONS[2] });
      const info = await t.mailroom.jobs.get(id);
      assert.deepEqual([info?.data, info?.key, info?.correlationId], [{ note: INJECTIONS[0] }, INJECTIONS[1], INJECTIONS[2]]);
      assert.equal(await jobCount(t), 2);
    });

    test('a negative or unreadable delay is refused', async () => {
      const t = await openWithOneJob(db);
      const job = uniqueJob();
      await refused(t, () => t.mailroom.enqueue(job, {}, { delay: -1 }), [/^delay:/, /0 or more/]);
      await refused(t, () => t.mailroom.enqueue(job, {}, { delay: '-5s' as never }), [/^delay:/, /not a duration/]);
      await refused(t, () => t.mailroom.enqueue(job, {}, { delay: Number.NaN }), [/^delay:/, /finite/]);
      await refused(t, () => t.mailroom.enqueue(job, {}, { delay: 'tomorrow' as never }), [/^delay:/]);
      await refused(t, () => t.mailroom.enqueueMany(job, [{}, {}], { delay: -100 }), [/^delay:/]);
      await refused(t, () => t.mailroom.enqueue(job, {}, { delay: '1000000000d' }), [/delay must be at most 100 years/]);
    });

    test('an invalid runAt is refused', async () => {
      const t = await openWithOneJob(db);
      const job = uniqueJob();
      for (const runAt of [new Date('not a date'), '2030-01-01', 1_900_000_000_000, null]) {
        await refused(t, () => t.mailroom.enqueue(job, {}, { runAt: runAt as never }), [/runAt/, /valid Date/]);
      }
      for (const runAt of [new Date(-8.64e15), new Date(Date.UTC(10000, 0, 1)), new Date(Date.UTC(1969, 0, 1))]) {
        await refused(t, () => t.mailroom.enqueue(job, {}, { runAt }), [/runAt must be between 1970 and 9999/]);
      }
    });

    test('a priority out of range or not an integer is refused', async () => {
      const t = await openWithOneJob(db);
      const job = uniqueJob();
      for (const priority of [32768, -32769, 1.5, Number.NaN, '1', 1e10]) {
        await refused(t, () => t.mailroom.enqueue(job, {}, { priority: priority as never }), [/priority/, /-32768 to 32767/]);
      }
      await t.mailroom.enqueue(job, {}, { priority: 32767 });
      await t.mailroom.enqueue(job, {}, { priority: -32768 });
      assert.equal(await jobCount(t), 3, 'the ends of the range are accepted');
    });

    test('maxAttempts below 1 or not an integer is refused by defineJob', async () => {
      const t = await openWithOneJob(db);
      for (const maxAttempts of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
        await refused(t, () => defineJob(`bad.attempts.${seq++}`, { retry: { maxAttempts } }), [/retry\.maxAttempts/, /integer from 1/]);
      }
      await refused(t, () => defineJob(`bad.backoff.${seq++}`, { retry: { backoff: { base: '10s', max: '1s' } } }), [/retry\.backoff\.max/]);
      await refused(t, () => defineJob(`bad.timeout.${seq++}`, { timeout: -5 }), [/timeout/]);
    });

    test('a NUL character or a lone surrogate in a payload is refused; the text "\\u0000" is kept as is', async () => {
      const t = await openWithOneJob(db);
      const job = uniqueJob();
      await refused(t, () => t.mailroom.enqueue(job, { s: 'a\u0000b' }), [/NUL character/, /jsonb cannot store/]);
      await refused(t, () => t.mailroom.enqueue(job, { ['key\u0000']: 1 }), [/NUL character/]);
      await refused(t, () => t.mailroom.enqueue(job, { s: 'half an emoji \ud83d' }), [/lone UTF-16 surrogate/]);
      await refused(t, () => t.mailroom.enqueue(job, {}, { key: 'k\u0000' }), [/key/, /without NUL/]);
      await refused(t, () => t.mailroom.enqueue(job, {}, { correlationId: 'c\u0000' }), [/correlationId/, /without NUL/]);
      const id = await t.mailroom.enqueue(job, { path: 'C:\\u0000\\dir', emoji: '😀' });
      assert.deepEqual((await t.mailroom.jobs.get(id))?.data, { path: 'C:\\u0000\\dir', emoji: '😀' }, 'round-trips unchanged');
    });

    test('enqueueMany with one bad item among good ones writes nothing at all and names the item', async () => {
      const t = await openWithOneJob(db);
      const plain = uniqueJob<Record<string, unknown>>();
      const good = Array.from({ length: 50 }, (_, n) => ({ n }));
      const withItem = (index: number, bad: Record<string, unknown>) => [...good.slice(0, index), bad, ...good.slice(index)];
      await refused(t, () => t.mailroom.enqueueMany(plain, withItem(7, { n: 10n })), [/item 7/, /BigInt/]);
      await refused(t, () => t.mailroom.enqueueMany(plain, withItem(49, { s: '\u0000' })), [/item 49/, /NUL/]);
      await refused(t, () => t.mailroom.enqueueMany(plain, withItem(0, { blob: 'x'.repeat(1024 * 1024) })), [/item 0/, /limit of 1048576 bytes/]);
      const typed = defineJob(`bad.input.zod.${seq++}`, { schema: z.object({ n: z.number() }) });
      await refused(t, () => t.mailroom.enqueueMany(typed, withItem(13, { n: 'thirteen' }) as never), [/item 13/, /data\.n/]);
      await refused(t, () => t.mailroom.enqueueMany(plain, good, { key: (d) => (d.n === 20 ? '' : `k${String(d.n)}`) }), [/key \(item 20\)/]);
      await refused(t, () => t.mailroom.enqueueMany(plain, 'not an array' as never), [/must be an array/]);
      // The same good items do go in.
      await t.mailroom.enqueueMany(plain, good);
      assert.equal(await jobCount(t), 1 + good.length);
    });

    test('a bad enqueue inside a transaction rolls back the good work done in it', async () => {
      const t = await openWithOneJob(db);
      const job = uniqueJob();
      await refused(t, () =>
        t.mailroom.transaction(async (tx) => {
          await t.mailroom.enqueue(job, { first: true }, { tx });
          await t.mailroom.enqueue(job, { second: 2n }, { tx });
        }),
        [/BigInt/],
      );
    });

    test('a job type no handler exists for is dead-lettered as unknown-type after exactly one attempt', async () => {
      const t = await openWithOneJob(db);
      const queue = `unknown_${seq++}`;
      // Defined in this process (so its policy of 5 attempts is known), but this worker has no handler for it.
      const defined = uniqueJob({ queue, retry: { maxAttempts: 5, backoff: { base: 10, max: 10 } } });
      // Never defined in this process, as when another service enqueues a type this one does not know:
      // a copy of a real definition under a name nothing registered.
      const foreign: JobDefinition<unknown, unknown> = { ...uniqueJob({ queue, retry: { maxAttempts: 5 } }), name: `from.another.service.${seq++}` };
      const ids = [await t.mailroom.enqueue(defined, { n: 1 }), await t.mailroom.enqueue(foreign, { n: 2 })];
      const handled = uniqueJob({ queue });
      const worker = t.mailroom.worker({ queues: [queue], concurrency: 2, handlers: { [handled.name]: () => {} } });
      const failed = waitForEvents(worker, 'failed', 2);
      await worker.start();
      try {
        const events = await failed;
        for (const [job, detail] of events) {
          assert.ok(ids.includes(job.id));
          assert.deepEqual([job.attempt, detail.category, detail.dead, detail.runAt], [1, 'unknown-type', true, null]);
          assert.match(detail.message, /no handler for job type/);
          assert.match(detail.message, new RegExp(job.type.replaceAll('.', '\\.')));
        }
      } finally {
        await worker.stop({ timeout: '5s' });
      }
      for (const id of ids) {
        const info = await t.mailroom.jobs.get(id);
        assert.ok(info);
        assert.equal(info.state, 'dead');
        assert.equal(info.deadReason, 'unknown-type');
        assert.equal(info.attempts, 1, 'one attempt, not retried');
        assert.equal(info.maxAttempts, 5);
        assert.equal(info.status, 'sent to support');
        assert.deepEqual(info.lastError?.category, 'unknown-type');
        assert.deepEqual(info.errors.map((e) => [e.attempt, e.category]), [[1, 'unknown-type']]);
      }
      assert.equal(await jobCount(t), 3, 'dead-lettered, not dropped');
    });
  });
}
