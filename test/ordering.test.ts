/**
 * Per-key ordering (guarantee 4): one job at a time per key, in enqueue order;
 * keys in parallel; a retrying head blocks only its key; dead heads release
 * (or hold) the key.
 */
import { describe, it } from 'node:test';
import { rowsRead } from './helpers/rows-read.ts';
import assert from 'node:assert/strict';
import { defineJob, type Job } from '../src/index.ts';
import pg from 'pg';
import { databaseUrl, testDatabases } from './helpers/databases.ts';
import { waitForEvents } from './helpers/events.ts';

for (const db of testDatabases()) {
  describe(`per-key ordering on ${db.name}`, () => {
    it('runs each key one job at a time in enqueue order, keys in parallel, with failures injected', async () => {
      const { mailroom } = await db.open();
      const job = defineJob<{ key: string; seq: number }>('ordering.step', { queue: 'ord', retry: { maxAttempts: 4, backoff: { base: 5, max: 20 } } });
      const keys = Array.from({ length: 12 }, (_, k) => `account-${k}`);
      const perKey = 15;
      // Enqueue interleaved across keys, in several statements and batches.
      for (let seq = 0; seq < perKey; seq += 5) {
        const batch = keys.flatMap((key) => Array.from({ length: 5 }, (_, i) => ({ key, seq: seq + i })));
        await mailroom.enqueueMany(job, batch, { orderingKey: (d) => d.key });
      }
      const log = new Map<string, number[]>();
      const running = new Set<string>();
      let overlap = 0;
      let maxParallel = 0;
      const failedOnce = new Set<string>();
      const worker = mailroom.worker({
        queues: ['ord'],
        concurrency: 8,
        pollInterval: 10,
        handlers: {
          [job.name]: async (j: Job<{ key: string; seq: number }>) => {
            if (running.has(j.data.key)) overlap++;
            running.add(j.data.key);
            maxParallel = Math.max(maxParallel, running.size);
            await new Promise((r) => setTimeout(r, 1));
            running.delete(j.data.key);
            const id = `${j.data.key}/${j.data.seq}`;
            if (j.data.seq % 4 === 1 && !failedOnce.has(id)) {
              failedOnce.add(id);
              throw new Error('transient: the key must wait for this retry');
            }
            log.set(j.data.key, [...(log.get(j.data.key) ?? []), j.data.seq]);
          },
        },
      });
      const done = waitForEvents(worker, 'completed', keys.length * perKey, 60_000);
      await worker.start();
      await done;
      await worker.stop();
      assert.equal(overlap, 0, 'two jobs of one key never ran at once');
      for (const key of keys) assert.deepEqual(log.get(key), Array.from({ length: perKey }, (_, i) => i), `order of ${key}`);
      assert.ok(maxParallel > 1, `different keys ran in parallel (max ${maxParallel})`);
    });

    it('a dead head lets its key move on by default, and holds it with ordering.onDead = hold', async () => {
      const { mailroom } = await db.open();
      const moveOn = defineJob<{ n: number; poison?: boolean }>('ordering.continue', { queue: 'dead-key', retry: { maxAttempts: 1 } });
      const hold = defineJob<{ n: number; poison?: boolean }>('ordering.hold', { queue: 'dead-key', retry: { maxAttempts: 1 }, ordering: { onDead: 'hold' } });
      await mailroom.enqueue(moveOn, { n: 1, poison: true }, { orderingKey: 'k1' });
      const next1 = await mailroom.enqueue(moveOn, { n: 2 }, { orderingKey: 'k1' });
      const heldHead = await mailroom.enqueue(hold, { n: 1, poison: true }, { orderingKey: 'k2' });
      const next2 = await mailroom.enqueue(hold, { n: 2 }, { orderingKey: 'k2' });
      const other = await mailroom.enqueue(hold, { n: 3 }, { orderingKey: 'k3' });
      const handler = (j: Job<{ poison?: boolean }>) => {
        if (j.data.poison) throw new Error('poison');
      };
      const worker = mailroom.worker({ queues: ['dead-key'], pollInterval: 10, handlers: { [moveOn.name]: handler, [hold.name]: handler } });
      const completed = waitForEvents(worker, 'completed', 2);
      const failed = waitForEvents(worker, 'failed', 2);
      await worker.start();
      await Promise.all([completed, failed]);
      await worker.stop();
      assert.equal((await mailroom.jobs.get(next1))?.state, 'completed');
      assert.equal((await mailroom.jobs.get(other))?.state, 'completed', 'one poisoned key does not block other keys');
      assert.equal((await mailroom.jobs.get(heldHead))?.state, 'dead');
      const held = await mailroom.jobs.get(next2);
      assert.equal(held?.state, 'available');
      assert.match(held?.status ?? '', /waiting for an earlier job with ordering key k2/);
    });

    it('a dead job holding its key (onDead = hold) that dead-letter retention deletes hands the key to the job behind it', async () => {
      const { mailroom, schema, sql } = await db.open();
      const hold = defineJob<{ n: number; poison?: boolean }>('ordering.hold-pruned', { queue: 'hold-pruned', retry: { maxAttempts: 1 }, ordering: { onDead: 'hold' } });
      const head = await mailroom.enqueue(hold, { n: 1, poison: true }, { orderingKey: 'k' });
      const next = await mailroom.enqueue(hold, { n: 2 }, { orderingKey: 'k' });
      const after = await mailroom.enqueue(hold, { n: 3 }, { orderingKey: 'k' });
      const ran: number[] = [];
      const handlers = {
        [hold.name]: (j: Job<{ n: number; poison?: boolean }>) => {
          ran.push(j.data.n);
          if (j.data.poison) throw new Error('poison');
        },
      };
      const first = mailroom.worker({ queues: ['hold-pruned'], pollInterval: 10, handlers });
      const died = waitForEvents(first, 'failed', 1);
      await first.start();
      await died;
      await first.stop();
      assert.equal((await mailroom.jobs.get(head))?.state, 'dead');
      assert.match((await mailroom.jobs.get(next))?.status ?? '', /waiting for an earlier job with ordering key k/);

      // Retention deletes the dead job (past dead.age, 14 days by default); nothing else is written.
      await sql(`UPDATE "${schema}".jobs SET finished_at = now() - interval '15 days' WHERE id = $1`, [head]);
      assert.equal((await mailroom.maintain()).pruned, 1);
      assert.equal(await mailroom.jobs.get(head), undefined);
      const blocked = await sql<{ id: string; blocked: boolean }>(`SELECT id, blocked FROM "${schema}".jobs ORDER BY ordering_seq`);
      assert.deepEqual(blocked, [{ id: next, blocked: false }, { id: after, blocked: true }], 'the next job has the key; the one after still waits behind it');

      const second = mailroom.worker({ queues: ['hold-pruned'], pollInterval: 10, handlers });
      const completed = waitForEvents(second, 'completed', 2);
      await second.start();
      await completed;
      await second.stop();
      assert.deepEqual(ran, [1, 2, 3]);
    });

    it('enqueueMany calls with the same keys in opposite orders, at once, do not deadlock; each key keeps its enqueue order', { skip: db.name === 'pglite' ? 'one connection: no two statements at once' : false }, async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob<{ key: string; from: string }>('ordering.crossed', { queue: 'crossed' });
      const keys = Array.from({ length: 200 }, (_, k) => `k${String(k).padStart(3, '0')}`);
      for (let round = 0; round < 5; round++) {
        await Promise.all([
          mailroom.enqueueMany(job, keys.map((key) => ({ key, from: `up-${round}` })), { orderingKey: (d) => d.key }),
          mailroom.enqueueMany(job, [...keys].reverse().map((key) => ({ key, from: `down-${round}` })), { orderingKey: (d) => d.key }),
        ]);
      }
      const rows = await sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE queue = 'crossed'`);
      assert.equal(rows[0]!.n, 2000);
      // Within one call, a key has one job; across calls each key's jobs are numbered in commit order.
      const perKey = await sql<{ ordering_key: string; seqs: number }>(
        `SELECT ordering_key, count(DISTINCT ordering_seq)::int AS seqs FROM "${schema}".jobs WHERE queue = 'crossed' GROUP BY ordering_key`,
      );
      assert.ok(perKey.every((r) => r.seqs === 10), 'every key has 10 jobs with distinct places in its order');
    });

    it('a completion of many keys and an enqueueMany of the same keys in the other order, at once, do not deadlock; each next job is unblocked', { skip: db.name === 'pglite' ? 'one connection: no two statements at once' : false }, async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob<{ key: string; n: number }>('ordering.release-crossed', { queue: 'release-crossed' });
      for (let round = 0; round < 5; round++) {
        const keys = Array.from({ length: 200 }, (_, k) => `r${round}-${String(k).padStart(3, '0')}`);
        await mailroom.enqueueMany(job, keys.map((key) => ({ key, n: 1 })), { orderingKey: (d) => d.key });
        // The heads claimed as a worker would, then completed in one statement, as the worker's
        // batched completion does, with its rows in the order opposite to the enqueue's keys.
        const claimed = await sql<{ id: string; claim_count: number; ordering_key: string }>(
          `UPDATE "${schema}".jobs SET state = 'active', claim_count = claim_count + 1, attempt = attempt + 1, locked_until = now() + interval '1 minute'
            WHERE queue = 'release-crossed' AND ordering_key LIKE $1 AND state = 'available' AND NOT blocked RETURNING id, claim_count, ordering_key`,
          [`r${round}-%`],
        );
        assert.equal(claimed.length, 200);
        const byKeyDown = [...claimed].sort((a, b) => (a.ordering_key < b.ordering_key ? 1 : -1));
        await Promise.all([
          sql(
            `UPDATE "${schema}".jobs AS j SET state = 'completed', finished_at = now(), locked_until = NULL
               FROM unnest($1::uuid[], $2::int[]) WITH ORDINALITY AS c(id, claim, ord)
              WHERE j.id = c.id AND j.claim_count = c.claim AND j.state = 'active'`,
            [byKeyDown.map((r) => r.id), byKeyDown.map((r) => r.claim_count)],
          ),
          mailroom.enqueueMany(job, keys.map((key) => ({ key, n: 2 })), { orderingKey: (d) => d.key }),
        ]);
        const waiting = await sql<{ n: number; blocked: boolean; count: number }>(
          `SELECT (payload->>'n')::int AS n, blocked, count(*)::int AS count FROM "${schema}".jobs
            WHERE queue = 'release-crossed' AND ordering_key LIKE $1 AND state <> 'completed' GROUP BY 1, 2`,
          [`r${round}-%`],
        );
        assert.deepEqual(waiting, [{ n: 2, blocked: false, count: 200 }], `round ${round}: every key's second job is free to run`);
      }
    });

    it('the release reads a few rows per key even in a session that planned it while the tables were nearly empty', { skip: db.name === 'pglite' ? 'needs PostgreSQL statistics views and a session of its own' : false }, async () => {
      const { mailroom, schema } = await db.open();
      const job = defineJob<{ n: number }>('ordering.plan', { queue: 'plan' });
      let next = 0;
      const add = (count: number) => mailroom.enqueueMany(job, Array.from({ length: count }, () => ({ n: next++ })), { orderingKey: (d) => `p${d.n}` });
      const session = new pg.Client({ connectionString: databaseUrl });
      await session.connect();
      try {
        // Claims as a worker's, then the completion as a worker's batched one, in this one session.
        const claimAndComplete = async (count: number) => {
          const { rows } = await session.query<{ id: string; claim_count: number }>(
            `UPDATE "${schema}".jobs SET state = 'active', claim_count = claim_count + 1, attempt = attempt + 1, locked_until = now() + interval '1 minute'
              WHERE id IN (SELECT id FROM "${schema}".jobs WHERE queue = 'plan' AND state = 'available' AND NOT blocked ORDER BY id LIMIT $1)
             RETURNING id, claim_count`,
            [count],
          );
          await session.query(
            `UPDATE "${schema}".jobs AS j SET state = 'completed', finished_at = now(), locked_until = NULL
               FROM unnest($1::uuid[], $2::int[]) AS c(id, claim) WHERE j.id = c.id AND j.claim_count = c.claim AND j.state = 'active'`,
            [rows.map((r) => r.id), rows.map((r) => r.claim_count)],
          );
          return rows.length;
        };
        await add(3);
        for (let i = 0; i < 3; i++) assert.equal(await claimAndComplete(1), 1); // the trigger's statements planned now
        await add(5000);
        const { rows: claimed } = await session.query<{ id: string; claim_count: number }>(
          `UPDATE "${schema}".jobs SET state = 'active', claim_count = claim_count + 1, attempt = attempt + 1, locked_until = now() + interval '1 minute'
            WHERE id IN (SELECT id FROM "${schema}".jobs WHERE queue = 'plan' AND state = 'available' AND NOT blocked ORDER BY id LIMIT 24)
           RETURNING id, claim_count`,
        );
        const before = await rowsRead(session, schema, 'jobs');
        await session.query(
          `UPDATE "${schema}".jobs AS j SET state = 'completed', finished_at = now(), locked_until = NULL
             FROM unnest($1::uuid[], $2::int[]) AS c(id, claim) WHERE j.id = c.id AND j.claim_count = c.claim AND j.state = 'active'`,
          [claimed.map((r) => r.id), claimed.map((r) => r.claim_count)],
        );
        const read = (await rowsRead(session, schema, 'jobs')) - before;
        // An index probe or two per key: a few dozen rows (24 here when written). A plan made for the
        // nearly empty table reads all 5,000 jobs at least once (5,027 with the first version of
        // migration 11), or every holder once per key.
        assert.ok(read < 2000, `completing 24 jobs of 24 keys read ${read} rows of jobs`);
      } finally {
        await session.end();
      }
    });

    it('an ordering key must be a string', async () => {
      const { mailroom, schema, sql } = await db.open();
      const job = defineJob('ordering.bad', { queue: 'bad' });
      await assert.rejects(mailroom.enqueue(job, {}, { orderingKey: 42 as unknown as string }), /orderingKey must be a string .* got number/);
      await assert.rejects(mailroom.enqueue(job, {}, { orderingKey: '' }), /orderingKey must be a non-empty string/);
      assert.deepEqual(await sql(`SELECT count(*)::int AS n FROM "${schema}".jobs`), [{ n: 0 }]);
    });
  });
}
