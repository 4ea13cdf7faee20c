/**
 * The dead-letter queue as a work surface (`mailroom.deadLetters`): filters,
 * keyset paging, validation, redaction, replay in place (interrupted and run
 * again, dry run, rate limit), discard releasing an ordering key, and the
 * replay records. Dead letters are made by real workers (handlers throwing),
 * except where a test needs a death time it can name (then finished_at is set
 * by SQL) or a consumer's invalid-message dead letter (inserted as ingest does).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { defineJob, PermanentError, ValidationError, type Job, type JobDefinition, type Mailroom } from '../src/index.ts';
import { newId } from '../src/ids.ts';
import pg from 'pg';
import { deadLetterQueries } from '../src/dead-letters/dead-letter-queries.ts';
import { filterParams, resolveFilter } from '../src/dead-letters/filter.ts';
import { databaseUrl, testDatabases, type TestMailroom } from './helpers/databases.ts';
import { rowsRead } from './helpers/rows-read.ts';
import { waitForEvents } from './helpers/events.ts';

interface Item {
  message: string;
  /** false: an ordinary error (with maxAttempts 1: dead as max-attempts); default: PermanentError. */
  permanent?: boolean;
  n?: number;
  [field: string]: unknown;
}

/** Enqueues the items and runs a worker whose handler fails each of them once; resolves to their ids once all are dead. */
async function makeDead<const T extends readonly { def: JobDefinition<Item>; items: Item[] }[]>(mailroom: Mailroom, jobs: T): Promise<{ -readonly [K in keyof T]: string[] }> {
  const ids: string[][] = [];
  for (const { def, items } of jobs) ids.push(await mailroom.enqueueMany(def, items));
  const handlers = Object.fromEntries(
    jobs.map(({ def }) => [
      def.name,
      (job: Job<Item>) => {
        throw job.data.permanent === false ? new Error(job.data.message) : new PermanentError(job.data.message);
      },
    ]),
  );
  const worker = mailroom.worker({ queues: [...new Set(jobs.map((j) => j.def.queue))], pollInterval: 10, concurrency: 20, handlers });
  const failed = waitForEvents(worker, 'failed', ids.flat().length);
  await worker.start();
  await failed;
  await worker.stop();
  return ids as { -readonly [K in keyof T]: string[] };
}

async function stateCounts(t: TestMailroom): Promise<Record<string, number>> {
  const rows = await t.sql<{ state: string; n: number }>(`SELECT state, count(*)::int AS n FROM "${t.schema}".jobs GROUP BY state`);
  return Object.fromEntries(rows.map((r) => [r.state, r.n]));
}

function isValidation(field: RegExp | string) {
  return (e: unknown) => {
    assert.ok(e instanceof ValidationError, `expected a ValidationError, got ${String(e)}`);
    assert.match(e.message, typeof field === 'string' ? new RegExp(field) : field);
    return true;
  };
}

for (const db of testDatabases()) {
  describe(`dead letters on ${db.name}`, () => {
    it('filters by queue, type, category (error category or dead reason), time, ids and text, alone and combined', async () => {
      const t = await db.open();
      const { mailroom, schema, sql } = t;
      const signup = defineJob<Item>('dl.filter.signup', { queue: 'dl-filter-a', retry: { maxAttempts: 1 } });
      const invoice = defineJob<Item>('dl.filter.invoice', { queue: 'dl-filter-b', retry: { maxAttempts: 1 } });
      const [[s1, s2, s3, s4], [i1, i2]] = await makeDead(mailroom, [
        { def: signup, items: [{ message: 'Address REJECTED by provider' }, { message: '50% off coupon invalid' }, { message: 'a_b failed' }, { message: 'timeout talking to smtp', permanent: false }] },
        { def: invoice, items: [{ message: '500 off is not a coupon' }, { message: 'axb failed' }] },
      ]);
      // A consumer's message that was not an event, stored as ingest stores it (src/consumers/ingest-queries.ts).
      const invalid = newId();
      await sql(
        `INSERT INTO "${schema}".jobs (id, queue, type, state, attempt, max_attempts, finished_at, dead_reason, last_error, payload)
         VALUES ($1, 'consumer.billing', 'mailroom.invalid-message', 'dead', 0, 1, now(), 'validation',
                 jsonb_build_object('category', 'validation', 'message', 'not a CloudEvent: missing specversion'), '{"body":"hello"}'::jsonb)`,
        [invalid],
      );
      const ids = async (filter: Parameters<Mailroom['deadLetters']['list']>[0]) =>
        (await mailroom.deadLetters.list(filter, { limit: 100 })).items.map((d) => d.id).sort();
      const sorted = (...list: (string | undefined)[]) => (list as string[]).sort();

      assert.deepEqual(await ids({}), sorted(s1, s2, s3, s4, i1, i2, invalid));
      assert.deepEqual(await ids({ queue: 'dl-filter-b' }), sorted(i1, i2));
      assert.deepEqual(await ids({ type: 'dl.filter.signup' }), sorted(s1, s2, s3, s4));
      assert.deepEqual(await ids({ category: 'permanent' }), sorted(s1, s2, s3, i1, i2));
      assert.deepEqual(await ids({ category: 'max-attempts' }), sorted(s4), 'the dead reason');
      assert.deepEqual(await ids({ category: 'transient' }), sorted(s4), 'the last error category of the same job');
      assert.deepEqual(await ids({ category: 'validation' }), sorted(invalid));
      assert.deepEqual(await ids({ text: 'rejected' }), sorted(s1), 'case-insensitive');
      assert.deepEqual(await ids({ text: '50%' }), sorted(s2), '% is a plain character');
      assert.deepEqual(await ids({ text: 'a_b' }), sorted(s3), '_ is a plain character');
      assert.deepEqual(await ids({ text: 'coupon' }), sorted(s2, i1));
      assert.deepEqual(await ids({ text: '\\' }), []);
      assert.deepEqual(await ids({ ids: [s1!, i2!, newId()] }), sorted(s1, i2));
      assert.deepEqual(await ids({ queue: 'dl-filter-a', category: 'permanent', text: 'failed' }), sorted(s3));
      assert.deepEqual(await ids({ type: 'dl.filter.invoice', text: 'coupon' }), sorted(i1));
      assert.deepEqual(await ids({ queue: 'dl-filter-b', type: 'dl.filter.signup' }), []);

      // Times: name each death time.
      const at = (iso: string) => new Date(iso);
      const deaths: [string, string][] = [[s1!, '2024-01-01T00:00:00Z'], [s2!, '2024-02-01T00:00:00Z'], [s3!, '2024-03-01T00:00:00Z'], [i1!, '2024-03-01T00:00:00Z']];
      for (const [id, when] of deaths) await sql(`UPDATE "${schema}".jobs SET finished_at = $2 WHERE id = $1`, [id, when]);
      assert.deepEqual(await ids({ until: '2024-02-01T00:00:00Z' }), sorted(s1, s2), 'until is inclusive');
      assert.deepEqual(await ids({ since: at('2024-02-01T00:00:00Z'), until: '2024-03-01' }), sorted(s2, s3, i1));
      assert.deepEqual(await ids({ since: '2024-02-15', until: '2024-03-15', queue: 'dl-filter-a' }), sorted(s3));
      assert.deepEqual(await ids({ since: '1h' }), sorted(s4, i2, invalid), 'a duration means that long ago');

      const [letter] = (await mailroom.deadLetters.list({ ids: [s4!] })).items;
      assert.deepEqual(
        { ...letter, firstSeenAt: undefined, diedAt: undefined },
        {
          id: s4,
          queue: 'dl-filter-a',
          owner: null,
          type: 'dl.filter.signup',
          category: 'transient',
          reason: 'max-attempts',
          message: 'timeout talking to smtp',
          attempts: 1,
          maxAttempts: 1,
          correlationId: null,
          firstSeenAt: undefined,
          diedAt: undefined,
          data: { message: 'timeout talking to smtp', permanent: false },
        },
      );
      assert.ok(letter!.diedAt.getTime() >= letter!.firstSeenAt.getTime());
    });

    it('pages newest first through every dead letter, without gaps or repeats, also across equal death times', async () => {
      const t = await db.open();
      const { mailroom, schema, sql } = t;
      const def = defineJob<Item>('dl.paging', { queue: 'dl-paging', retry: { maxAttempts: 1 } });
      const [ids] = await makeDead(mailroom, [{ def, items: Array.from({ length: 23 }, (_, n) => ({ message: `boom ${n}`, n })) }]);
      // Ten share one death time to the microsecond (the cursor must break ties by id); the rest are spread out.
      await sql(`UPDATE "${schema}".jobs SET finished_at = '2024-05-01T10:00:00.123456Z' WHERE id = ANY($1::uuid[])`, [ids!.slice(0, 10)]);
      for (const [i, id] of ids!.slice(10).entries()) {
        await sql(`UPDATE "${schema}".jobs SET finished_at = '2024-05-01T10:00:00.123456Z'::timestamptz + $2 * interval '1 microsecond' WHERE id = $1`, [id, i - 6]);
      }
      const seen: string[] = [];
      const diedAt: number[] = [];
      let cursor: string | null = null;
      let pages = 0;
      do {
        const page: Awaited<ReturnType<Mailroom['deadLetters']['list']>> = await mailroom.deadLetters.list({ queue: 'dl-paging' }, { limit: 4, cursor });
        assert.ok(page.items.length <= 4);
        seen.push(...page.items.map((d) => d.id));
        diedAt.push(...page.items.map((d) => d.diedAt.getTime()));
        cursor = page.next;
        pages++;
        // A dead letter arriving while paging is newer than the cursor: it does not shift the pages.
        if (pages === 2) await makeDead(mailroom, [{ def, items: [{ message: 'late' }] }]);
      } while (cursor !== null);
      assert.equal(pages, 6, '23 items in pages of 4');
      assert.equal(new Set(seen).size, 23, 'no repeats');
      assert.deepEqual([...seen].sort(), [...ids!].sort(), 'no gaps');
      assert.deepEqual(diedAt, [...diedAt].sort((a, b) => b - a), 'newest first');
      const all = await mailroom.deadLetters.list({ queue: 'dl-paging' }, { limit: 1000 });
      assert.equal(all.items.length, 24);
      assert.equal(all.next, null);
    });

    it('refuses bad filters and options with errors that name the field and the fix', async () => {
      const { mailroom } = await db.open();
      const dl = mailroom.deadLetters;
      await assert.rejects(dl.list({ queues: 'x' } as never), isValidation(/queues is not a filter field.*the fields are queue, type/));
      await assert.rejects(dl.list({ queue: 42 } as never), isValidation(/queue must be a non-empty string, got number/));
      await assert.rejects(dl.list({ since: 'yesterday' }), isValidation(/since "yesterday" is not a time; give an ISO 8601 date .* or a duration/));
      await assert.rejects(dl.list({ until: new Date('nope') }), isValidation(/until is an invalid Date/));
      await assert.rejects(dl.list({ since: '2024-03-01', until: '2024-02-01' }), isValidation(/since \(2024-03-01T00:00:00.000Z\) is after until .*swap them/));
      await assert.rejects(dl.list({ ids: ['not-a-uuid'] }), isValidation(/ids\[0\] "not-a-uuid" is not a job id; job ids are UUIDs/));
      await assert.rejects(dl.list({ ids: 'x' } as never), isValidation(/ids must be an array/));
      await assert.rejects(dl.list({ ids: [] }), isValidation(/ids is empty/));
      await assert.rejects(dl.list({}, { limit: 0 }), isValidation(/limit must be a whole number from 1 to 1000/));
      await assert.rejects(dl.list({}, { cursor: 'garbage' }), isValidation(/cursor is not a cursor this list returned; pass the `next` of a previous page/));
      await assert.rejects(dl.list({}, { after: 'x' } as never), isValidation(/after is not an option/));
      await assert.rejects(dl.replay({}), isValidation(/the filter is empty, which would replay every dead letter;.*all: true/));
      await assert.rejects(dl.discard({}), isValidation(/would discard every dead letter/));
      await assert.rejects(dl.replay({ all: true }, { ratePerSecond: 0 }), isValidation(/ratePerSecond must be a number above 0/));
      await assert.rejects(dl.replay({ all: 'yes' } as never), isValidation(/all must be true or false/));
      await assert.rejects(dl.discard({ all: true }, { ratePerSecond: 5 } as never), isValidation(/ratePerSecond is not an option of discard/));
      await assert.rejects(dl.replay({ all: true }, { limit: 1.5 }), isValidation(/limit must be a whole number/));
      // Nothing was recorded for refused calls.
      assert.deepEqual((await dl.replay({ all: true }, { dryRun: true })).matched, 0);
    });

    it('redacts the configured payload fields in list, show and jobs.get, and names the queue owner', async () => {
      const t = await db.open({ redact: ['password', 'card.number'], queues: { 'dl-redact': { owner: 'growth' } } });
      const def = defineJob<Item>('dl.redact', { queue: 'dl-redact', retry: { maxAttempts: 1 } });
      const data = { message: 'card declined', user: { name: 'Ada', password: 'hunter2' }, card: { number: '4242424242424242', exp: '12/30' }, items: [{ password: 'p' }] };
      const [[id]] = await makeDead(t.mailroom, [{ def, items: [data] }]);
      const hidden = { message: 'card declined', user: { name: 'Ada', password: '[redacted]' }, card: { number: '[redacted]', exp: '12/30' }, items: [{ password: '[redacted]' }] };
      const [listed] = (await t.mailroom.deadLetters.list({ queue: 'dl-redact' })).items;
      assert.deepEqual(listed?.data, hidden);
      assert.equal(listed?.owner, 'growth');
      const shown = await t.mailroom.deadLetters.show(id!);
      assert.deepEqual(shown?.data, hidden);
      assert.equal(shown?.owner, 'growth');
      assert.deepEqual((await t.mailroom.jobs.get(id!))?.data, hidden);
      // Only the output is redacted: the job keeps its payload for the replay.
      const [row] = await t.sql<{ payload: unknown }>(`SELECT payload FROM "${t.schema}".jobs WHERE id = $1`, [id]);
      assert.deepEqual(row?.payload, data);
    });

    it('show: one dead letter with its errors and history; undefined for a job that is not dead or does not exist', async () => {
      const { mailroom } = await db.open();
      const def = defineJob<Item>('dl.show', { queue: 'dl-show', retry: { maxAttempts: 1 } });
      const [[id]] = await makeDead(mailroom, [{ def, items: [{ message: 'no such user' }] }]);
      const letter = await mailroom.deadLetters.show(id!);
      assert.equal(letter?.category, 'permanent');
      assert.equal(letter?.reason, 'permanent');
      assert.deepEqual(letter?.errors.map((e) => [e.attempt, e.category, e.message]), [[1, 'permanent', 'no such user']]);
      assert.deepEqual(letter?.history.map((h) => h.event), ['enqueued', 'started', 'failed', 'dead-lettered']);
      assert.equal(await mailroom.deadLetters.show(newId()), undefined);
      assert.equal(await mailroom.deadLetters.show('not-a-uuid'), undefined);
      const waiting = await mailroom.enqueue(def, { message: 'later' }, { delay: '1h' });
      assert.equal(await mailroom.deadLetters.show(waiting), undefined);
    });

    it('replays in place: same id, available, fresh attempts and maxAge, a replayed line in the history, then runs to completion', async () => {
      const t = await db.open();
      const { mailroom, schema, sql } = t;
      const def = defineJob<Item>('dl.replay', { queue: 'dl-replay', retry: { maxAttempts: 1, maxAge: '1h' } });
      const [[id, other]] = await makeDead(mailroom, [{ def, items: [{ message: 'bug in the handler' }, { message: 'stays dead' }] }]);
      // As if it had died an hour and more after it was enqueued: its maxAge is spent.
      await sql(`UPDATE "${schema}".jobs SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour' WHERE id = $1`, [id]);
      const result = await mailroom.deadLetters.replay({ ids: [id!] }, { by: 'alice@ops' });
      assert.deepEqual({ ...result, replayId: undefined }, { matched: 1, replayed: 1, replayId: undefined, notFound: [], skipped: 0, dryRun: false, interrupted: false });
      const replayed = await mailroom.jobs.get(id!);
      assert.equal(replayed?.id, id);
      assert.equal(replayed?.state, 'available');
      assert.equal(replayed?.attempts, 1);
      assert.equal(replayed?.maxAttempts, 2, 'one fresh attempt on top of the one spent');
      assert.equal(replayed?.deadReason, null);
      assert.deepEqual(replayed?.errors.map((e) => e.message), ['bug in the handler'], 'errors kept');
      const line = replayed?.history.find((h) => h.event === 'replayed');
      assert.equal(line?.by, 'alice@ops');
      assert.equal(line?.detail, `replay ${result.replayId} by alice@ops`);
      const [row] = await sql<{ fresh: boolean }>(`SELECT expires_at > now() + interval '50 minutes' AS fresh FROM "${schema}".jobs WHERE id = $1`, [id]);
      assert.equal(row?.fresh, true, 'a fresh maxAge');
      assert.equal((await mailroom.jobs.get(other!))?.state, 'dead', 'the other dead letter was not touched');

      const worker = mailroom.worker({ queues: ['dl-replay'], pollInterval: 10, handlers: { [def.name]: () => {} } });
      const completed = waitForEvents(worker, 'completed', 1);
      await worker.start();
      await completed;
      await worker.stop();
      const done = await mailroom.jobs.get(id!);
      assert.equal(done?.state, 'completed');
      assert.deepEqual(done?.history.map((h) => h.event), ['enqueued', 'started', 'failed', 'dead-lettered', 'replayed', 'started', 'completed']);
      assert.equal(done?.history.find((h) => h.event === 'dead-lettered')?.detail, 'permanent', 'the death before the replay is kept in the history');

      const records = await sql(`SELECT id, action, filter, matched, replayed, dry_run, by, interrupted, finished_at IS NOT NULL AS finished FROM "${schema}".dead_letter_replays`);
      assert.deepEqual(records, [
        { id: result.replayId, action: 'replay', filter: { ids: [id] }, matched: 1, replayed: 1, dry_run: false, by: 'alice@ops', interrupted: false, finished: true },
      ]);
      const links = await sql(`SELECT job_id, replay_id, dead_reason, attempt FROM "${schema}".dead_letter_replay_jobs`);
      assert.deepEqual(links, [{ job_id: id, replay_id: result.replayId, dead_reason: 'permanent', attempt: 1 }]);
    });

    it('an aborted replay stops after a committed batch; run again, every job is replayed exactly once and none is lost', async () => {
      const t = await db.open();
      const { mailroom, schema, sql } = t;
      const def = defineJob<Item>('dl.abort', { queue: 'dl-abort', retry: { maxAttempts: 1 } });
      const [ids] = await makeDead(mailroom, [{ def, items: Array.from({ length: 30 }, (_, n) => ({ message: `boom ${n}` })) }]);
      const controller = new AbortController();
      const progress: number[] = [];
      const first = await mailroom.deadLetters.replay(
        { queue: 'dl-abort' },
        { ratePerSecond: 100, signal: controller.signal, onProgress: (p) => { progress.push(p.done); controller.abort(); } },
      );
      assert.equal(first.interrupted, true);
      assert.equal(first.matched, 30);
      assert.equal(first.replayed, 10, 'one batch of rate/10 jobs, committed before the abort was seen');
      assert.deepEqual(progress, [10]);
      assert.deepEqual(await stateCounts(t), { available: 10, dead: 20 });
      const second = await mailroom.deadLetters.replay({ queue: 'dl-abort' });
      assert.deepEqual([second.matched, second.replayed, second.interrupted], [20, 20, false]);
      assert.deepEqual(await stateCounts(t), { available: 30 });
      const perJob = await sql<{ job_id: string; n: number }>(`SELECT job_id, count(*)::int AS n FROM "${schema}".dead_letter_replay_jobs GROUP BY job_id`);
      assert.deepEqual(perJob.map((r) => r.job_id).sort(), [...ids!].sort(), 'every job replayed');
      assert.ok(perJob.every((r) => r.n === 1), 'each exactly once');
      const records = await sql<{ id: string; replayed: number; interrupted: boolean }>(`SELECT id, replayed, interrupted FROM "${schema}".dead_letter_replays ORDER BY started_at`);
      assert.deepEqual(records, [
        { id: first.replayId, replayed: 10, interrupted: true },
        { id: second.replayId, replayed: 20, interrupted: false },
      ]);
      const third = await mailroom.deadLetters.replay({ queue: 'dl-abort' });
      assert.deepEqual([third.matched, third.replayed], [0, 0], 'nothing left to replay');
    });

    it('a job a replay put back that dies again before the replay ends is not replayed twice by it', async () => {
      const t = await db.open();
      const { mailroom, schema, sql } = t;
      const def = defineJob<Item>('dl.again', { queue: 'dl-again', retry: { maxAttempts: 1 } });
      const [ids] = await makeDead(mailroom, [{ def, items: Array.from({ length: 6 }, (_, n) => ({ message: `boom ${n}` })) }]);
      // A worker that kills every replayed job again at once, while the replay (one job per batch, 5/s: about a second) goes on.
      const worker = mailroom.worker({ queues: ['dl-again'], pollInterval: 10, handlers: { [def.name]: () => { throw new PermanentError('still broken'); } } });
      let diedAgain = 0;
      let replaying = true;
      worker.on('failed', () => void (replaying && diedAgain++));
      await worker.start();
      const result = await mailroom.deadLetters.replay({ queue: 'dl-again' }, { ratePerSecond: 5, limit: 100 });
      replaying = false;
      await worker.stop();
      assert.ok(diedAgain >= 1, 'a replayed job died again while the replay ran');
      assert.deepEqual([result.matched, result.replayed], [6, 6], 'each dead job once, however often it dies again');
      const links = await sql<{ job_id: string; n: number }>(
        `SELECT job_id, count(*)::int AS n FROM "${schema}".dead_letter_replay_jobs WHERE replay_id = $1 GROUP BY job_id`,
        [result.replayId],
      );
      assert.deepEqual(links.map((r) => r.job_id).sort(), [...ids!].sort());
      assert.ok(links.every((r) => r.n === 1));
    });

    it('a replay reads no link rows to find its next batch, whatever the link table holds (PostgreSQL statistics)', { skip: db.name === 'pglite' ? 'needs PostgreSQL statistics views and a session of its own' : false }, async () => {
      const t = await db.open();
      const { mailroom, schema, sql } = t;
      // 3,000 dead jobs without running them: as dead as a worker would leave them.
      const def = defineJob<Item>('dl.many', { queue: 'dl-many', retry: { maxAttempts: 1 } });
      for (let i = 0; i < 3; i++) await mailroom.enqueueMany(def, Array.from({ length: 1000 }, (_, n) => ({ message: `m${i}-${n}` })));
      await sql(
        `UPDATE "${schema}".jobs SET state = 'dead', attempt = 1, dead_reason = 'permanent', finished_at = now() - interval '1 minute',
                last_error = '{"category":"permanent","message":"boom"}'::jsonb WHERE queue = 'dl-many'`,
      );
      // Statistics as autovacuum leaves them on a quiet system: the jobs as they are, no replay link yet.
      await sql(`ANALYZE "${schema}".jobs, "${schema}".dead_letter_replay_jobs`);
      const session = new pg.Client({ connectionString: databaseUrl });
      await session.connect();
      try {
        const queries = deadLetterQueries(`"${schema}"`);
        const params = filterParams(resolveFilter({ queue: 'dl-many' }));
        const replayId = newId();
        await session.query(queries.startRecord.text, [replayId, 'replay', '{}', 3000, false, null]);
        const before = await rowsRead(session, schema, 'dead_letter_replay_jobs');
        let replayed = 0;
        for (;;) {
          // A named statement, as mailroom runs it: after a few runs PostgreSQL may keep one plan for all.
          const { rowCount } = await session.query({ name: 'replay_batch', text: queries.replayBatch.text, values: [...params, replayId, 100, [], []] });
          replayed += rowCount ?? 0;
          if ((rowCount ?? 0) < 100) break;
        }
        const read = (await rowsRead(session, schema, 'dead_letter_replay_jobs')) - before;
        assert.equal(replayed, 3000);
        // Probing the record's links per dead job, with the plan kept from while the table was nearly
        // empty, read every link for each dead job: 30 batches over 3,000 dead jobs read millions of rows.
        assert.ok(read < 100, `replaying 3,000 dead jobs read ${read} link rows`);
      } finally {
        await session.end();
      }
    });

    it('a dry run changes nothing and reports what matches; the call is still recorded', async () => {
      const t = await db.open();
      const def = defineJob<Item>('dl.dry', { queue: 'dl-dry', retry: { maxAttempts: 1 } });
      await makeDead(t.mailroom, [{ def, items: [{ message: 'a' }, { message: 'b' }, { message: 'c' }] }]);
      const before = await t.sql(`SELECT * FROM "${t.schema}".jobs ORDER BY id`);
      const replay = await t.mailroom.deadLetters.replay({ queue: 'dl-dry' }, { dryRun: true, by: 'bob' });
      assert.deepEqual([replay.matched, replay.replayed, replay.dryRun], [3, 0, true]);
      const discard = await t.mailroom.deadLetters.discard({ text: 'b' }, { dryRun: true });
      assert.deepEqual([discard.matched, discard.discarded, discard.dryRun], [1, 0, true]);
      assert.deepEqual(await t.sql(`SELECT * FROM "${t.schema}".jobs ORDER BY id`), before);
      assert.deepEqual(await t.sql(`SELECT count(*)::int AS n FROM "${t.schema}".dead_letter_replay_jobs`), [{ n: 0 }]);
      const records = await t.sql(`SELECT action, matched, replayed, dry_run, by, finished_at IS NOT NULL AS finished FROM "${t.schema}".dead_letter_replays ORDER BY started_at`);
      assert.equal(records.length, 2);
      assert.deepEqual(records[0], { action: 'replay', matched: 3, replayed: 0, dry_run: true, by: 'bob', finished: true });
      assert.equal((records[1] as { action: string }).action, 'discard');
    });

    it('honours ratePerSecond: 20 jobs at 40/s take at least ~475 ms', async () => {
      const t = await db.open();
      const def = defineJob<Item>('dl.rate', { queue: 'dl-rate', retry: { maxAttempts: 1 } });
      await makeDead(t.mailroom, [{ def, items: Array.from({ length: 20 }, (_, n) => ({ message: `slow ${n}` })) }]);
      const seen: { done: number; at: number }[] = [];
      const started = performance.now();
      const result = await t.mailroom.deadLetters.replay({ queue: 'dl-rate' }, { ratePerSecond: 40, onProgress: (p) => seen.push({ done: p.done, at: performance.now() - started }) });
      const elapsed = performance.now() - started;
      assert.equal(result.replayed, 20);
      assert.ok(elapsed >= 450, `took ${elapsed.toFixed(0)} ms; 20 jobs at 40/s need at least 475 ms`);
      // Never ahead of the rate: the n-th job no earlier than (n - 1) / 40 s after the start.
      for (const p of seen) assert.ok(p.at >= ((p.done - 1) / 40) * 1000 - 5, `${p.done} jobs done after ${p.at.toFixed(0)} ms`);
      assert.ok(seen.length > 1, 'in several batches');
    });

    it('discard: dead to cancelled, recorded, and a job holding its ordering key lets the next job of the key run', async () => {
      const t = await db.open();
      const { mailroom, schema, sql } = t;
      const def = defineJob<Item>('dl.ordered', { queue: 'dl-ordered', retry: { maxAttempts: 1 }, ordering: { onDead: 'hold' } });
      const head = await mailroom.enqueue(def, { message: 'poison' }, { orderingKey: 'account:1' });
      const ran: string[] = [];
      const worker = mailroom.worker({
        queues: ['dl-ordered'],
        pollInterval: 10,
        handlers: { [def.name]: (job: Job<Item>) => { ran.push(job.data.message); if (job.data.message === 'poison') throw new PermanentError('poison'); } },
      });
      const failed = waitForEvents(worker, 'failed', 1);
      await worker.start();
      await failed;
      const next = await mailroom.enqueue(def, { message: 'next' }, { orderingKey: 'account:1' });
      const [blocked] = await sql<{ blocked: boolean }>(`SELECT blocked FROM "${schema}".jobs WHERE id = $1`, [next]);
      assert.equal(blocked?.blocked, true, 'the dead head holds the key');
      const completed = waitForEvents(worker, 'completed', 1);
      const result = await mailroom.deadLetters.discard({ ids: [head], all: true }, { by: 'carol' });
      assert.deepEqual({ ...result, replayId: undefined }, { matched: 1, discarded: 1, replayId: undefined, notFound: [], dryRun: false, interrupted: false });
      await completed;
      await worker.stop();
      assert.deepEqual(ran, ['poison', 'next']);
      const info = await mailroom.jobs.get(head);
      assert.equal(info?.state, 'cancelled');
      assert.deepEqual(info?.history.map((h) => h.event), ['enqueued', 'started', 'failed', 'dead-lettered', 'discarded']);
      assert.equal(info?.history.at(-1)?.by, 'carol');
      const [record] = await sql(`SELECT action, matched, replayed, by FROM "${schema}".dead_letter_replays WHERE id = $1`, [result.replayId]);
      assert.deepEqual(record, { action: 'discard', matched: 1, replayed: 1, by: 'carol' });
      assert.equal((await mailroom.deadLetters.list({ ids: [head] })).items.length, 0);
    });

    it('replay of a dead head that holds its ordering key (onDead: hold): it runs first, then the jobs waiting behind it, in order', async () => {
      const t = await db.open();
      const { mailroom, schema, sql } = t;
      const def = defineJob<Item>('dl.held', { queue: 'dl-held', retry: { maxAttempts: 1 }, ordering: { onDead: 'hold' } });
      let fixed = false;
      const ran: string[] = [];
      const worker = mailroom.worker({
        queues: ['dl-held'],
        pollInterval: 10,
        handlers: {
          [def.name]: (job: Job<Item>) => {
            ran.push(job.data.message);
            if (job.data.message === 'first' && !fixed) throw new PermanentError('bug in the handler');
          },
        },
      });
      const head = await mailroom.enqueue(def, { message: 'first' }, { orderingKey: 'ledger:7' });
      const failed = waitForEvents(worker, 'failed', 1);
      await worker.start();
      await failed;
      await mailroom.enqueueMany(def, [{ message: 'second' }, { message: 'third' }], { orderingKey: 'ledger:7' });
      const waiting = await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE queue = 'dl-held' AND blocked`);
      assert.equal(waiting[0]?.n, 2, 'both wait behind the dead head');
      fixed = true; // the bug is fixed and deployed; the operator replays the dead letter
      const completed = waitForEvents(worker, 'completed', 3);
      const result = await mailroom.deadLetters.replay({ ids: [head] });
      assert.equal(result.replayed, 1);
      await completed;
      await worker.stop();
      assert.deepEqual(ran, ['first', 'first', 'second', 'third'], 'the replayed head keeps its place: the key is never handed on');
    });

    it('reports ids that are not dead letters as notFound, and leaves a dead letter whose dedup key is taken', async () => {
      const t = await db.open();
      const { mailroom } = t;
      const def = defineJob<Item>('dl.notfound', { queue: 'dl-notfound', retry: { maxAttempts: 1 } });
      const [[dead, keyed]] = await makeDead(mailroom, [{ def, items: [{ message: 'x' }, { message: 'y' }] }]);
      const waiting = await mailroom.enqueue(def, { message: 'z' }, { delay: '1h' });
      const missing = newId();
      const result = await mailroom.deadLetters.replay({ ids: [dead!, missing, waiting] });
      assert.deepEqual(result.notFound, [missing, waiting]);
      assert.deepEqual([result.matched, result.replayed], [1, 1]);
      assert.equal((await mailroom.jobs.get(waiting))?.state, 'scheduled', 'a waiting job is not touched');

      // A dead job with a dedup key that a new job now holds cannot be replayed without breaking the key.
      const keyedDef = defineJob<Item>('dl.keyed', { queue: 'dl-notfound', retry: { maxAttempts: 1 } });
      const first = await mailroom.enqueue(keyedDef, { message: 'first' }, { key: 'order:9' });
      const worker = mailroom.worker({ queues: ['dl-notfound'], pollInterval: 10, handlers: { [keyedDef.name]: () => { throw new PermanentError('first'); } } });
      const failed = waitForEvents(worker, 'failed', 1);
      await worker.start();
      await failed;
      await worker.stop();
      const second = await mailroom.enqueue(keyedDef, { message: 'second' }, { key: 'order:9', delay: '1h' });
      assert.notEqual(second, first);
      const keyedResult = await mailroom.deadLetters.replay({ type: 'dl.keyed' });
      assert.deepEqual([keyedResult.matched, keyedResult.replayed, keyedResult.skipped], [1, 0, 1]);
      assert.equal((await mailroom.jobs.get(first))?.state, 'dead');
      assert.equal((await mailroom.jobs.get(keyed!))?.state, 'dead', 'other dead letters untouched');
    });

    it('retention prunes dead letters past dead.age together with their replay links', async () => {
      const t = await db.open();
      const { mailroom, schema, sql } = t;
      const def = defineJob<Item>('dl.retention', { queue: 'dl-retention', retry: { maxAttempts: 1 } });
      const [[id]] = await makeDead(mailroom, [{ def, items: [{ message: 'old' }] }]);
      await mailroom.deadLetters.replay({ ids: [id!] });
      await sql(`UPDATE "${schema}".jobs SET state = 'dead', finished_at = now() - interval '15 days' WHERE id = $1`, [id]);
      assert.equal((await mailroom.maintain()).pruned, 1, 'default dead.age: 14 days');
      assert.deepEqual(await sql(`SELECT count(*)::int AS n FROM "${schema}".dead_letter_replay_jobs`), [{ n: 0 }]);
      assert.deepEqual(await sql(`SELECT count(*)::int AS n FROM "${schema}".dead_letter_replays`), [{ n: 1 }], 'the record of the replay stays');
    });
  });
}
