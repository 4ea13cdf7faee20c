/**
 * The relay's commit-safe read: nothing skipped when transactions commit out
 * of order, per-key order when xid order is not commit order, an open
 * transaction holding the relay back (and reported), the fenced lease, the
 * NOTIFY wake-up and retention. Crash tests with relay processes are in
 * relay-crash.test.ts.
 */
import { describe, it } from 'node:test';
import { rowsRead } from './helpers/rows-read.ts';
import assert from 'node:assert/strict';
import pg from 'pg';
import { defineEvent, handleEvent, type CloudEventEnvelope, type RelayedEvent, type RelayEvents, type RelayTarget } from '../src/index.ts';
import { newId } from '../src/ids.ts';
import { databaseUrl, testDatabases, type TestMailroom } from './helpers/databases.ts';
import { eventually } from './helpers/events.ts';
import { flushEachUntil, flushUntil } from './helpers/relay.ts';

const happened = defineEvent<{ n: number }>('relay.happened', { version: 1 });
const padded = defineEvent<{ n: number; pad: string }>('relay.padded', { version: 1 });

function capture(name = 'capture', readAhead = false): RelayTarget & { envelopes: CloudEventEnvelope[]; ns(): number[] } {
  const envelopes: CloudEventEnvelope[] = [];
  return {
    name,
    readAhead,
    envelopes,
    ns: () => envelopes.map((e) => (e.data as { n: number }).n),
    publish: async (events) => void envelopes.push(...events.map((e) => e.envelope)),
  };
}

/** Writes an outbox row with a chosen transaction id, as a transaction with that id would have. */
async function craft(t: TestMailroom, n: number, xid: string, key: string | null): Promise<void> {
  await t.sql(
    `INSERT INTO "${t.schema}".outbox (xid, id, type, version, source, subject, time, data)
     VALUES ($1::xid8, $2, 'relay.happened', 1, '/test', $3, now(), $4::jsonb)`,
    [xid, newId(), key, JSON.stringify({ n })],
  );
}

/** Rolls back whatever a test left open on its pooled sessions and gives them back. */
async function endSessions(...clients: pg.PoolClient[]): Promise<void> {
  for (const c of clients) {
    await c.query('ROLLBACK').catch(() => {});
    c.release();
  }
}

for (const db of testDatabases()) {
  describe(`relay on ${db.name}`, () => {
    for (const path of ['trigger', 'set-wise'] as const) it(
      `a keyed publish reads a row or two to find its key's previous row, even in a session that planned it while the outbox was nearly empty (${path === 'trigger' ? 'the trigger' : 'outbox_publish_keyed'})`,
      { skip: db.name === 'pglite' ? 'needs PostgreSQL statistics views and a session of its own' : false },
      async () => {
        const t = await db.open();
        const session = new pg.Client({ connectionString: databaseUrl });
        await session.connect();
        // A row without a position goes through the trigger; publish's batches with keys through the function.
        const insert = (keys: string[]) =>
          path === 'trigger'
            ? session.query(
                `INSERT INTO "${t.schema}".outbox (id, type, version, source, subject, time, data)
                 SELECT gen_random_uuid(), 'relay.happened', 1, '/test', k, now(), '{}'::jsonb FROM unnest($1::text[]) AS k`,
                [keys],
              )
            : session.query(
                `SELECT * FROM "${t.schema}".outbox_publish_keyed(ARRAY(SELECT gen_random_uuid() FROM unnest($1::text[])), 'relay.happened', 1, '/test', now(),
                   NULL, NULL, NULL, NULL, $1::text[], ARRAY(SELECT '{}' FROM unnest($1::text[])), NULL)`,
                [keys],
              );
        try {
          // Enough single-row publishes for the session to keep a generic plan of the look-up.
          for (let i = 0; i < 8; i++) await insert([`early${i % 2}`]);
          await t.sql(`ANALYZE "${t.schema}".outbox`); // statistics of a table of 8 rows
          for (let i = 0; i < 8; i++) await insert([`early${i % 2}`]);
          await t.sql(
            `INSERT INTO "${t.schema}".outbox (id, type, version, source, subject, time, data)
             SELECT gen_random_uuid(), 'relay.happened', 1, '/test', 'hot', now(), '{}'::jsonb FROM generate_series(1, 5000)`,
          );
          const before = await rowsRead(session, t.schema, 'outbox');
          await insert(Array.from({ length: 24 }, (_, i) => `fresh${i}`));
          await insert(['hot']);
          const read = (await rowsRead(session, t.schema, 'outbox')) - before;
          // A probe of the key's index per publish: at most a row each (25 here). Walking the primary key down
          // from the newest row and filtering by key reads the 5,000 rows of the hot key for each new key.
          assert.ok(read < 200, `25 keyed publishes read ${read} rows of the outbox`);
          console.log(`# 25 keyed publishes read ${read} rows of the outbox`);
          const [hot] = await t.sql<{ prev: string }>(
            `SELECT o.prev_position::text AS prev FROM "${t.schema}".outbox AS o WHERE o.subject = 'hot' ORDER BY o.position DESC LIMIT 1`,
          );
          const [last] = await t.sql<{ position: string }>(
            `SELECT o.position::text AS position FROM "${t.schema}".outbox AS o WHERE o.subject = 'hot' ORDER BY o.position DESC OFFSET 1 LIMIT 1`,
          );
          assert.equal(hot?.prev, last?.position);
        } finally {
          await session.end();
        }
      },
    );

    const modes = [false, true].flatMap((readAhead) => [true, false].map((recorded) => ({ readAhead, recorded })));
    for (const { readAhead, recorded } of modes) it(`keeps per-key order when xid order is not position order, extending or cutting a batch as needed${readAhead ? ', a read-ahead target' : ''}${recorded ? '' : ', rows that name no previous row (walked)'}`, async () => {
      const t = await db.open();
      /** Rows published under REPEATABLE READ, or before migration 12, name no previous row of their key. */
      const forget = () => (recorded ? Promise.resolve() : t.sql(`UPDATE "${t.schema}".outbox SET prev_position = NULL, prev_xid = NULL`));
      // Positions follow insert order; xids are chosen. Key K: n=1 (xid 200), n=2 (xid 150), n=4 (xid 180).
      await craft(t, 1, '200', 'K');
      await craft(t, 2, '150', 'K');
      await craft(t, 3, '120', null);
      await craft(t, 4, '180', 'K');
      await forget();
      if (recorded) {
        const prev = await t.sql<{ n: number; prev_position: string | null; prev_xid: string | null }>(
          `SELECT (data->>'n')::int AS n, prev_position::text AS prev_position, prev_xid::text AS prev_xid FROM "${t.schema}".outbox ORDER BY position`,
        );
        assert.deepEqual(
          prev.map((r) => [r.n, r.prev_position, r.prev_xid]),
          [[1, '0', '0'], [2, '1', '200'], [3, null, null], [4, '2', '150']],
          'each keyed row names its key\'s previous row (0: none); a row without a key names none',
        );
      }
      const target = capture('capture', readAhead);
      const relay = t.mailroom.relay({ internal: false, to: [target], batchSize: 2 });
      const reports: RelayEvents['held-back'][0][] = [];
      relay.on('held-back', (info) => reports.push(info));
      const first = await relay.flush();
      assert.equal(first.capture?.delivered, 4);
      // (xid, position) order is 3, 2, 4, 1; delivered in batches that keep K's rows in position order.
      assert.deepEqual(target.ns(), [3, 1, 2, 4]);
      const ks = target.envelopes.filter((e) => e.subject === 'K').map((e) => (e.data as { n: number }).n);
      assert.deepEqual(ks, [1, 2, 4]);

      // A row whose earlier same-key row is behind the fence (its transaction looks still open: a huge xid)
      // waits for it; then both go, in position order.
      await craft(t, 5, '1000000000000000', 'K2');
      await craft(t, 6, '300', 'K2');
      await craft(t, 7, '310', null);
      await forget();
      const held = await relay.flush();
      assert.deepEqual(held.capture, { delivered: 0, heldBack: true, leased: true }, 'n=7 comes after n=6 in xid order: nothing passes n=6');
      const stats = await t.mailroom.stats();
      assert.equal(stats.relay.capture?.unpublished, 3);
      assert.notEqual(stats.relay.capture?.heldBackBy, null);
      assert.equal(reports.length, 1, 'reported once (then at most every 10 s)');
      assert.equal(reports[0]?.waiting, 3);
      // Its transaction "committed" (and so did the xid n=6 recorded for it).
      await t.sql(`UPDATE "${t.schema}".outbox SET xid = '250' WHERE (data->>'n')::int = 5`);
      await t.sql(`UPDATE "${t.schema}".outbox SET prev_xid = '250' WHERE prev_xid = '1000000000000000'`);
      assert.equal((await relay.flush()).capture?.delivered, 3);
      assert.deepEqual(target.ns(), [3, 1, 2, 4, 5, 6, 7]);
      assert.equal((await t.mailroom.stats()).relay.capture?.unpublished, 0);
      await relay.stop();
    });

    it('a row published after a rolled-back savepoint names the last row that stayed, not the rolled-back one', async () => {
      const t = await db.open();
      await t.mailroom.publishMany(happened, [{ n: 0 }, { n: 1 }], { key: () => 'K' });
      await t.mailroom.transaction(async (tx) => {
        await tx.query('SAVEPOINT before_two');
        await t.mailroom.publish(happened, { n: 2 }, { key: 'K', tx });
        await tx.query('ROLLBACK TO SAVEPOINT before_two');
        await t.mailroom.publish(happened, { n: 3 }, { key: 'K', tx });
      });
      const rows = await t.sql<{ n: number; position: string; prev_position: string }>(
        `SELECT (o.data->>'n')::int AS n, o.position::text AS position, o.prev_position::text AS prev_position FROM "${t.schema}".outbox AS o ORDER BY o.position`,
      );
      assert.deepEqual(rows.map((r) => r.n), [0, 1, 3]);
      assert.equal(rows[2]!.prev_position, rows[1]!.position, 'n=3 names n=1');
      const target = capture();
      const relay = t.mailroom.relay({ internal: false, to: [target], batchSize: 1 });
      await flushUntil(relay, 3, 'capture');
      assert.deepEqual(target.ns(), [0, 1, 3]);
      await relay.stop();
    });

    it("a target added after retention deleted a row's recorded previous row still delivers it", async () => {
      const t = await db.open();
      // Key K: n=1 (position 1, xid 300), then n=2 (position 2, xid 200), which records n=1 as its previous row.
      await craft(t, 1, '300', 'K');
      await craft(t, 2, '200', 'K');
      const first = capture('first');
      const relay = t.mailroom.relay({ internal: false, to: [first] });
      assert.equal((await relay.flush()).first?.delivered, 2);
      await relay.stop();
      // Retention deletes n=1 (older) and keeps n=2; then a new target starts from the beginning.
      await t.sql(`UPDATE "${t.schema}".outbox SET created_at = now() - interval '2 days' WHERE (data->>'n')::int = 1`);
      assert.deepEqual(await t.mailroom.relay({ internal: false, to: [first], retention: 24 * 3600_000 }).prune(), { events: 1, parked: 0 });
      const late = capture('late');
      const lateRelay = t.mailroom.relay({ internal: false, to: [late] });
      const flushed = await Promise.race([lateRelay.flush(), new Promise<'stuck'>((r) => setTimeout(() => r('stuck'), 5000).unref())]);
      assert.notEqual(flushed, 'stuck', 'the flush came back');
      assert.deepEqual(late.ns(), [2]);
      await lateRelay.stop();
    });

    it('a read-ahead target: the next batch is read during the confirm; a failed publish is retried from the cursor, nothing skipped or reordered; context.tx is refused', async () => {
      const t = await db.open();
      for (let n = 1; n <= 23; n++) await craft(t, n, String(100 + n), `k${n % 3}`);
      const delivered: number[] = [];
      let calls = 0;
      const flaky: RelayTarget = {
        name: 'flaky',
        readAhead: true,
        async publish(events) {
          calls++;
          if (calls === 3) throw new Error('broker hiccup on the third batch');
          delivered.push(...events.map((e) => (e.envelope.data as { n: number }).n));
        },
      };
      const relay = t.mailroom.relay({ internal: false, to: [flaky], batchSize: 5 });
      const errors: unknown[] = [];
      relay.on('error', (e) => errors.push(e));
      await assert.rejects(relay.flush(), /broker hiccup/);
      const again = await relay.flush();
      assert.equal(again.flaky?.delivered, 13, 'the failed batch and the rest');
      assert.deepEqual(delivered, Array.from({ length: 23 }, (_, i) => i + 1), 'each event once, in order');
      assert.equal((await t.mailroom.stats()).relay.flaky?.unpublished, 0);
      await relay.stop();

      await craft(t, 24, '200', null);
      const usesTx: RelayTarget = { name: 'uses-tx', readAhead: true, publish: async (_events, context) => void (await context.tx.query('SELECT 1')) };
      const wrong = t.mailroom.relay({ internal: false, to: [usesTx] });
      await assert.rejects(wrong.flush(), /declared readAhead: true.*context\.tx cannot be used/);
      assert.equal((await t.mailroom.stats()).relay['uses-tx']?.unpublished, 24, 'nothing was marked delivered');
      await wrong.stop();
    });

    it('a second stop() resolves only once the first has ended: the leases are back before it returns', async () => {
      const t = await db.open();
      const noted = defineEvent<{ n: number }>('relay.second-stop', { version: 1 });
      let publishing: (() => void) | undefined;
      const started = new Promise<void>((resolve) => (publishing = resolve));
      // A publish that takes 400 ms, so the first stop waits for the round in flight.
      const slow: RelayTarget = { name: 'slow', publish: async () => { publishing?.(); await new Promise((resolve) => setTimeout(resolve, 400)); } };
      const relay = t.mailroom.relay({ internal: false, to: [slow], pollInterval: 50 });
      await t.mailroom.publish(noted, { n: 1 });
      await relay.start();
      await started;
      let firstEnded = false;
      const first = relay.stop().then(() => void (firstEnded = true));
      await relay.stop();
      assert.equal(firstEnded, true, 'the second stop resolved while the first was still stopping');
      const [lease] = await t.sql<{ n: number }>(`SELECT count(*)::int AS n FROM "${t.schema}".relay_cursors WHERE target = 'slow' AND holder IS NOT NULL`);
      assert.equal(lease!.n, 0, 'the lease was handed back before the second stop resolved');
      await first;
    });

    it('reads in numeric (xid, position) order across digit boundaries', async () => {
      const t = await db.open();
      for (let n = 0; n < 12; n++) await craft(t, n, String(95 + n), n % 2 === 0 ? 'even' : null); // xids 95..106, positions 1..12
      const target = capture();
      const relay = t.mailroom.relay({ internal: false, to: [target], batchSize: 5 });
      assert.equal((await relay.flush()).capture?.delivered, 12);
      assert.deepEqual(target.ns(), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
      await relay.stop();
    });

    it('fans out committed events once, never rolled-back ones; a replayed fan-out adds no job', async () => {
      const t = await db.open();
      const { mailroom } = t;
      const consumer = mailroom.consumer({ group: 'audit', handlers: { [happened.type]: () => {} } });
      await consumer.start();
      await consumer.stop(); // the subscription stays; its jobs are counted below
      const committed: string[] = [];
      for (let n = 0; n < 5; n++) committed.push((await mailroom.publish(happened, { n }, { key: `k${n % 2}` })).id);
      let rolledBack = '';
      await assert.rejects(
        mailroom.transaction(async (tx) => {
          rolledBack = (await mailroom.publish(happened, { n: 99 }, { tx, key: 'k0' })).id;
          throw new Error('rolled back');
        }),
      );
      const relay = mailroom.relay();
      await flushUntil(relay, 5);
      const jobs = async () => t.sql<{ event: string; n: number; key: string }>(
        `SELECT payload->>'id' AS event, (payload->'data'->>'n')::int AS n, ordering_key AS key FROM "${t.schema}".jobs WHERE queue = 'consumer.audit' ORDER BY ordering_seq`,
      );
      const first = await jobs();
      assert.deepEqual(first.map((j) => j.event).sort(), [...committed].sort());
      assert.ok(!first.some((j) => j.event === rolledBack));
      assert.deepEqual(first.filter((j) => j.key === 'k0').map((j) => j.n), [0, 2, 4]);
      await t.sql(`UPDATE "${t.schema}".relay_cursors SET cursor_xid = '0', cursor_position = 0`); // replay everything
      await flushUntil(relay, 5);
      assert.equal((await jobs()).length, 5, 'the same (group, event) job id: nothing new');
      await relay.stop();
    });

    it('one relay per target: a held lease is refused, an expired one is taken over, and the old holder is fenced off', async () => {
      const t = await db.open();
      const a = capture('shared');
      const b = capture('shared');
      const relayA = t.mailroom.relay({ internal: false, to: [a], lease: '1h', id: 'relay-a' });
      const relayB = t.mailroom.relay({ internal: false, to: [b], lease: '1h', id: 'relay-b' });
      await t.mailroom.publish(happened, { n: 1 });
      await flushUntil(relayA, 1, 'shared');
      assert.equal((await relayB.flush()).shared?.leased, false);
      await t.sql(`UPDATE "${t.schema}".relay_cursors SET locked_until = now() - interval '1 second'`); // A stopped renewing
      await t.mailroom.publish(happened, { n: 2 });
      await flushUntil(relayB, 1, 'shared');
      await t.mailroom.publish(happened, { n: 3 });
      const lost: RelayEvents['lease-lost'][0][] = [];
      relayA.on('lease-lost', (info) => lost.push(info));
      const refused = (await relayA.flush()).shared;
      assert.deepEqual({ delivered: refused?.delivered, leased: refused?.leased }, { delivered: 0, leased: false }, 'A still believes it holds the lease: its round is refused');
      assert.deepEqual(lost, [{ target: 'shared' }]);
      assert.deepEqual(a.ns(), [1]);
      assert.deepEqual(b.ns(), [2]);
      const [row] = await t.sql<{ holder: string; token: string }>(`SELECT holder, token::text AS token FROM "${t.schema}".relay_cursors`);
      assert.deepEqual(row, { holder: 'relay-b', token: '2' });
      await relayB.stop(); // hands the lease back: A can take it at once
      await flushUntil(relayA, 1, 'shared');
      assert.deepEqual(a.ns(), [1, 3]);
      await relayA.stop();
    });

    it('a pipelined target: the next batch goes out before this one is confirmed, conditional on its last event; a refused or failed send is sent again without the condition, nothing skipped or reordered', async () => {
      const t = await db.open();
      for (let n = 1; n <= 23; n++) await craft(t, n, String(100 + n), `k${n % 3}`);
      // A broker with JetStream's rules: a send conditional on `after` stores nothing unless `after` is the
      // stream's last entry; an event already stored is not stored again (its id deduplicates).
      const stream: (number | 'foreign')[] = [];
      const calls: { ns: number[]; after: number | null; pending: number; earlierStored: boolean }[] = [];
      let pending = 0;
      let wakeWaiting: (() => void) | null = null;
      let failCall = 6;
      const nOf = (e: RelayedEvent) => (e.envelope.data as { n: number }).n;
      const target: RelayTarget = {
        name: 'piped',
        readAhead: true,
        pipelined: true,
        async publish(events, context) {
          const ns = events.map(nOf);
          const after = context.after === undefined ? null : nOf(context.after);
          const earlierStored = Array.from({ length: ns[0]! - 1 }, (_, i) => i + 1).every((n) => stream.includes(n));
          calls.push({ ns, after, pending, earlierStored });
          wakeWaiting?.();
          pending++;
          try {
            // Confirms come when the next send arrives (or after 1 s): the relay may send ahead, never has to.
            await new Promise<void>((resolve) => {
              const timer = setTimeout(resolve, 1000);
              wakeWaiting = () => (clearTimeout(timer), resolve());
            });
            if (calls.length === failCall) throw new Error('broker hiccup');
            if (calls.length === 3) stream.push('foreign'); // another publisher writes into the stream
            if (after !== null && stream.at(-1) !== after) throw new Error('wrong last message id');
            for (const n of ns) if (!stream.includes(n)) stream.push(n);
          } finally {
            pending--;
          }
        },
      };
      const relay = t.mailroom.relay({ internal: false, to: [target], batchSize: 5 });
      await assert.rejects(relay.flush(), /broker hiccup/);
      failCall = 0;
      await relay.flush();
      await relay.stop();
      assert.deepEqual(stream.filter((n) => n !== 'foreign'), Array.from({ length: 23 }, (_, i) => i + 1), 'each event once, in order');
      assert.ok(calls.some((c) => c.after !== null && c.pending > 0), `a batch went out while the one before it waited for its confirm: ${JSON.stringify(calls)}`);
      for (const c of calls) {
        if (c.after === null) assert.ok(c.earlierStored, `an unconditional send only once every event before it is stored: ${JSON.stringify(calls)}`);
        else assert.equal(c.after, c.ns[0]! - 1, 'conditional on the event just before it');
      }
      // The second batch went out conditional on 5, the other publisher's entry came first: refused, then sent again.
      const refused = calls.findIndex((c) => c.ns[0] === 6 && c.after === 5);
      assert.ok(refused >= 0 && calls.slice(refused + 1).some((c) => c.ns[0] === 6 && c.after === null), `the refused batch was sent again without the condition: ${JSON.stringify(calls)}`);
      assert.equal((await t.mailroom.stats()).relay.piped?.unpublished, 0);
    });

    it('a read-ahead target whose lease is taken during its publish: the cursor stays, the batch read ahead is dropped unpublished', async () => {
      const t = await db.open();
      for (let n = 1; n <= 6; n++) await craft(t, n, String(100 + n), null);
      const published: number[][] = [];
      const target: RelayTarget = {
        name: 'stolen',
        readAhead: true,
        async publish(events) {
          published.push(events.map((e) => (e.envelope.data as { n: number }).n));
          // Another relay takes the lease while this batch is with the broker.
          await t.sql(`UPDATE "${t.schema}".relay_cursors SET holder = 'relay-b', token = token + 1 WHERE target = 'stolen'`);
        },
      };
      const relay = t.mailroom.relay({ internal: false, to: [target], batchSize: 2, id: 'relay-a' });
      const lost: RelayEvents['lease-lost'][0][] = [];
      relay.on('lease-lost', (info) => lost.push(info));
      const result = (await relay.flush()).stolen;
      assert.deepEqual({ delivered: result?.delivered, leased: result?.leased }, { delivered: 0, leased: false });
      assert.deepEqual(lost, [{ target: 'stolen' }]);
      assert.deepEqual(published, [[1, 2]], 'the batch read ahead (3, 4) was not published');
      const [row] = await t.sql<{ cursor_position: string; holder: string }>(`SELECT cursor_position::text AS cursor_position, holder FROM "${t.schema}".relay_cursors`);
      assert.deepEqual(row, { cursor_position: '0', holder: 'relay-b' }, 'the cursor did not move under the stolen lease');
      await relay.stop();
    });

    it('a NOTIFY wakes an idle relay and the consumer before their poll; retention prunes only delivered events', async () => {
      const t = await db.open();
      const { mailroom } = t;
      // A target that has delivered nothing yet keeps every event from being pruned.
      await t.sql(`INSERT INTO "${t.schema}".relay_cursors (target) VALUES ('late')`);
      const handled: number[] = [];
      const consumer = mailroom.consumer({ group: 'fast', pollInterval: '1m', handlers: { [happened.type]: handleEvent(happened, (e) => void handled.push(e.data.n)) } });
      await consumer.start();
      const relay = mailroom.relay({ pollInterval: '1m', retention: 0 });
      await relay.start();
      await new Promise((r) => setTimeout(r, 100)); // both are idle, waiting for a minute
      const started = Date.now();
      await mailroom.publish(happened, { n: 1 });
      await eventually(() => handled.length === 1, 10_000, 'the event handled');
      assert.ok(Date.now() - started < 10_000);
      await relay.stop();
      await consumer.stop();
      const late = mailroom.relay({ internal: false, to: [capture('late')] });
      await mailroom.publish(happened, { n: 2 });
      await flushUntil(mailroom.relay({ retention: 0 }), 1);
      assert.deepEqual(await mailroom.relay({ retention: 0 }).prune(), { events: 0, parked: 0 });
      await flushUntil(late, 2, 'late');
      assert.deepEqual(await mailroom.relay({ retention: 0 }).prune(), { events: 2, parked: 0 });
      assert.deepEqual(await t.sql(`SELECT position FROM "${t.schema}".outbox`), []);
      await late.stop();
    });

    it(
      'a read-ahead target reading past an unconfirmed batch stops at the fence: an open transaction\'s event is not skipped',
      { skip: db.name === 'pglite' ? 'PGlite serves one connection: two transactions cannot be open at once' : false },
      async () => {
        const t = await db.open();
        const pool = (await db.handle()) as pg.Pool;
        const c1 = await pool.connect();
        const target = capture('ahead', true);
        const relay = t.mailroom.relay({ internal: false, to: [target], batchSize: 2 });
        try {
          for (let n = 1; n <= 3; n++) await t.mailroom.publish(happened, { n }, { key: `a${n}` });
          await c1.query('BEGIN');
          await t.mailroom.publish(happened, { n: 4 }, { tx: c1, key: 'open' }); // T1 holds an xid below the next one
          await t.mailroom.publish(happened, { n: 5 }, { key: 'late' }); // committed, but behind T1: beyond the fence
          // Batch 1 (1, 2) is read from the cursor; batch 2 is read past it, in the statement that also reads the fence.
          // (flushUntil waits out other test files' transactions, and fails if more than 3 are delivered.)
          await flushUntil(relay, 3, 'ahead');
          assert.deepEqual(target.ns(), [1, 2, 3], 'nothing past the open transaction');
          await c1.query('COMMIT');
          await flushUntil(relay, 2, 'ahead');
          assert.deepEqual(target.ns(), [1, 2, 3, 4, 5]);
        } finally {
          await endSessions(c1);
          await relay.stop();
        }
      },
    );

    it(
      'commit order differs from position order: nothing is skipped, the relay is held back by the open transaction and says which',
      { skip: db.name === 'pglite' ? 'PGlite serves one connection: two transactions cannot be open at once' : false },
      async () => {
        const t = await db.open();
        const pool = (await db.handle()) as pg.Pool;
        const [c1, c2] = [await pool.connect(), await pool.connect()];
        const target = capture();
        const relay = t.mailroom.relay({ internal: false, to: [target] });
        const reports: RelayEvents['held-back'][0][] = [];
        relay.on('held-back', (info) => reports.push(info));
        try {
          await c1.query('BEGIN');
          const { id: first } = await t.mailroom.publish(happened, { n: 1 }, { tx: c1, key: 'a' });
          const [{ pid, xid }] = (await c1.query(`SELECT pg_backend_pid() AS pid, pg_current_xact_id()::text AS xid`)).rows as [{ pid: number; xid: string }];
          await c2.query('BEGIN');
          await t.mailroom.publish(happened, { n: 2 }, { tx: c2, key: 'b' });
          await c2.query('COMMIT'); // committed, but after T1's xid: behind the fence
          // Other test files share the server: wait until T1 is the oldest open transaction, so that the
          // relay's one report (then at most every 10 s) names it.
          const oldest = async () =>
            (await pool.query<{ pid: number }>(`SELECT pid FROM pg_stat_activity WHERE backend_xid IS NOT NULL ORDER BY age(backend_xid) DESC LIMIT 1`)).rows[0]?.pid;
          await eventually(async () => (await oldest()) === pid, 10_000, 'T1 the oldest open transaction');
          const held = await relay.flush();
          assert.deepEqual(held.capture, { delivered: 0, heldBack: true, leased: true });
          // Other test files share the server: wait until T1 is the oldest open transaction.
          await eventually(async () => (await t.mailroom.stats()).relay.capture?.heldBackBy?.xid === xid, 10_000, 'T1 holding the fence');
          assert.deepEqual(target.ns(), []);
          const stats = (await t.mailroom.stats()).relay.capture!;
          assert.equal(stats.unpublished, 1, 'T2\'s event is visible and waiting');
          assert.equal(stats.heldBackBy?.pid, pid);
          assert.ok((stats.heldBackBy?.ageSeconds ?? -1) >= 0);
          assert.equal(reports.at(-1)?.heldBackBy.pid, pid, 'reported as an event too');
          assert.equal(reports.at(-1)?.waiting, 1);
          await c1.query('COMMIT');
          await flushUntil(relay, 2, 'capture');
          assert.deepEqual(target.ns(), [1, 2]);
          assert.equal(target.envelopes[0]?.id, first);
          assert.equal((await t.mailroom.stats()).relay.capture?.heldBackBy, null);
        } finally {
          await endSessions(c1, c2);
          await relay.stop();
        }
      },
    );

    for (const isolation of ['READ COMMITTED', 'REPEATABLE READ'] as const) {
      it(
        `per-key order: a transaction that got its xid first but took the key second is delivered second, one event per batch (${isolation} publisher)`,
        { skip: db.name === 'pglite' ? 'PGlite serves one connection: two transactions cannot be open at once' : false },
        async () => {
          const t = await db.open();
          const pool = (await db.handle()) as pg.Pool;
          await t.sql(`CREATE TABLE "${t.schema}".scratch (n int)`);
          const handled: number[] = [];
          const consumer = t.mailroom.consumer({ group: 'ordered', pollInterval: 20, handlers: { [happened.type]: handleEvent(happened, (e) => void handled.push(e.data.n)) } });
          await consumer.start();
          const target = capture();
          // One event per batch: the relay meets n=2 (older xid) first, and must read on to n=1 rather than
          // deliver n=2 alone.
          const relay = t.mailroom.relay({ to: [target], batchSize: 1 });
          // The key's row exists beforehand, so a REPEATABLE READ publish locks it rather than meeting
          // a row inserted after its snapshot (which is a serialization failure, retried by the caller).
          await t.mailroom.publish(happened, { n: 0 }, { key: 'K' });
          const [c1, c2] = [await pool.connect(), await pool.connect()];
          try {
            await c2.query(`BEGIN ISOLATION LEVEL ${isolation}`);
            await c2.query(`INSERT INTO "${t.schema}".scratch VALUES (0)`); // T2 takes its xid (and snapshot) now
            await c1.query('BEGIN');
            await t.mailroom.publish(happened, { n: 1 }, { tx: c1, key: 'K' });
            await c1.query('COMMIT');
            await t.mailroom.publish(happened, { n: 2 }, { tx: c2, key: 'K' }); // takes K after T1 committed
            await c2.query('COMMIT');
            const rows = await t.sql<{ n: number; position: string; xid: string; prev_position: string | null; prev_xid: string | null }>(
              `SELECT (data->>'n')::int AS n, position::text AS position, xid::text AS xid, prev_position::text AS prev_position, prev_xid::text AS prev_xid
                 FROM "${t.schema}".outbox ORDER BY position`,
            );
            const [r0, r1, r2] = rows;
            assert.deepEqual(rows.map((r) => r.n), [0, 1, 2]);
            assert.ok(BigInt(r2!.xid) < BigInt(r1!.xid), 'the second event has the older xid');
            assert.deepEqual([r1!.prev_position, r1!.prev_xid], [r0!.position, r0!.xid]);
            // Under READ COMMITTED the publish sees T1's row once it holds the key; a REPEATABLE READ snapshot
            // predates it, so the row names none and the relay walks the key.
            if (isolation === 'READ COMMITTED') assert.deepEqual([r2!.prev_position, r2!.prev_xid], [r1!.position, r1!.xid]);
            else assert.deepEqual([r2!.prev_position, r2!.prev_xid], [null, null]);
            // Both targets: the consumer's jobs come through the internal one, whose round another test's
            // transaction may hold back after the capture's got through (the relay is not started).
            await flushEachUntil(relay, 3, ['capture', 'internal']);
            assert.deepEqual(target.ns(), [0, 1, 2]);
            await eventually(() => handled.length === 3, 10_000, 'all handled');
            assert.deepEqual(handled, [0, 1, 2]);
          } finally {
            await endSessions(c1, c2);
            await relay.stop();
            await consumer.stop();
          }
        },
      );
    }

    for (const readAhead of [false, true]) {
      it(`with the default batch size, reads grow during a backlog and start over after it; a given batchSize stays (${readAhead ? 'read-ahead' : 'transactional'} target)`, async () => {
        const t = await db.open();
        const sizes: number[] = [];
        const target: RelayTarget = { name: 'sizes', readAhead, publish: async (events) => void sizes.push(events.length) };
        // One transaction each, so that another test's transaction on the shared server holds all of them back or none.
        const publish = (from: number, count: number, pad = '') => t.mailroom.publishMany(padded, Array.from({ length: count }, (_, k) => ({ n: from + k, pad })));
        await publish(0, 2600);
        const relay = t.mailroom.relay({ internal: false, to: [target] });
        await flushUntil(relay, 2600, 'sizes');
        assert.deepEqual(sizes, [100, 200, 400, 800, 1000, 100], 'doubling from 100 to 1,000 while full batches leave more waiting');
        sizes.length = 0;
        await publish(2600, 150);
        await flushUntil(relay, 150, 'sizes');
        assert.deepEqual(sizes, [100, 50], 'after the backlog was gone, back to 100');

        // Large envelopes: a batch of 100 holds 100 x 30,000 characters; twice that would pass 4 Mi, so reads do not grow.
        sizes.length = 0;
        await publish(2750, 350, 'x'.repeat(30_000));
        await flushUntil(relay, 350, 'sizes');
        assert.deepEqual(sizes, [100, 100, 100, 50]);

        // Given, the size is fixed.
        sizes.length = 0;
        await publish(3100, 450);
        const fixed = t.mailroom.relay({ internal: false, to: [{ ...target, name: 'fixed' }], batchSize: 100 });
        await flushUntil(fixed, 3550, 'fixed'); // a new target starts at the beginning of the outbox
        assert.ok(sizes.length === 36 && sizes.every((n) => n <= 100), `batches of at most 100: ${sizes.join(', ')}`);
        await Promise.all([relay.stop(), fixed.stop()]);
      });
    }
  });
}
