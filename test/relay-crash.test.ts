/**
 * The relay under SIGKILL (guarantees 1 and 2 for events): relay processes are
 * killed mid-batch again and again while two of them run at once and
 * producers commit out of order and roll some transactions back. Every
 * committed event must be fanned out exactly once to every group, no
 * rolled-back event ever, and each key's jobs must queue in commit order.
 *
 * Relays run as child processes (test/fixtures/relay-process.ts) against a
 * real PostgreSQL server, so the suite needs TEST_DATABASE_URL.
 *
 * What is trusted: `fanout_log` gets a row from a BEFORE INSERT trigger on the
 * jobs table, in the relay's transaction, for every job a fan-out tried to
 * insert (also one that ON CONFLICT then skipped). It commits only with the
 * relay's cursor, so it is the record of every committed fan-out: two relays
 * fanning out the same event, or one replaying a batch, would show as two
 * rows even though the deterministic job id lets only one job exist.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { createMailroom, defineEvent, type Mailroom } from '../src/index.ts';
import { uniqueSchema } from './helpers/databases.ts';
import { eventually } from './helpers/events.ts';
import type { RelayProcessConfig, RelayProcessLine } from './fixtures/relay-process.ts';
import { fixtureBundle } from './helpers/fixture-bundle.ts';

const url = process.env.TEST_DATABASE_URL;
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const FIXTURE = fileURLToPath(new URL('./fixtures/relay-process.ts', import.meta.url));
/** The fixture bundled once, so restarted relays boot fast (see helpers/fixture-bundle.ts). */
const FIXTURE_JS = await fixtureBundle(FIXTURE);
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
const randomInt = (min: number, max: number) => min + Math.floor(Math.random() * (max - min + 1));

const happened = defineEvent<{ n: number }>('crash.happened', { version: 1 });

interface Child {
  proc: ChildProcess;
  lines: RelayProcessLine[];
  ready: Promise<void>;
  readyAt: number;
  exited: Promise<void>;
  killedByTest: boolean;
  stderr: () => string;
}

describe(
  'relay processes killed mid-batch, two at once (PostgreSQL)',
  { skip: url ? false : 'TEST_DATABASE_URL is not set: these tests run relay processes against a PostgreSQL server (PGlite serves one process only)' },
  () => {
    let admin: pg.Pool;
    const children = new Set<Child>();
    const spawned: Child[] = [];
    const unexpected: string[] = [];
    const cleanup: (() => Promise<void>)[] = [];

    const spawnRelay = (config: RelayProcessConfig): Child => {
      const proc = spawn(process.execPath, [FIXTURE_JS, JSON.stringify(config)], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
      let stderr = '';
      proc.stderr!.setEncoding('utf8');
      proc.stderr!.on('data', (chunk: string) => (stderr = (stderr + chunk).slice(-4000)));
      const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
      let onReady = () => {};
      const ready = new Promise<void>((resolve, reject) => {
        onReady = resolve;
        void exited.then(() => reject(new Error(`relay ${proc.pid} exited before it was ready: ${stderr}`)));
      });
      ready.catch(() => {});
      const child: Child = { proc, lines: [], ready, readyAt: Number.POSITIVE_INFINITY, exited, killedByTest: false, stderr: () => stderr };
      createInterface({ input: proc.stdout! }).on('line', (text) => {
        try {
          const line = JSON.parse(text) as RelayProcessLine;
          child.lines.push(line);
          if (line.event === 'ready') {
            child.readyAt = Date.now();
            onReady();
          }
        } catch {
          // not a protocol line
        }
      });
      proc.once('exit', (code, signal) => {
        children.delete(child);
        if (!child.killedByTest) unexpected.push(`relay ${proc.pid} exited on its own (${code ?? signal}): ${stderr}`);
      });
      children.add(child);
      spawned.push(child);
      return child;
    };

    const kill = async (child: Child) => {
      child.killedByTest = true;
      if (child.proc.exitCode === null && child.proc.signalCode === null) child.proc.kill('SIGKILL');
      await child.exited;
    };

    before(() => {
      admin = new pg.Pool({ connectionString: url!, max: 3 });
    });

    after(async () => {
      await Promise.all([...children].map(kill));
      for (const fn of cleanup.splice(0)) await fn().catch(() => {});
      await admin.end();
    });

    it('every committed event reaches every group exactly once, in per-key commit order; no rolled-back event ever does', { timeout: 150_000 }, async (t) => {
      const schema = uniqueSchema('rcrash');
      const q = `"${schema}"`;
      const mailroom: Mailroom = await createMailroom({ database: url!, schema, poolSize: 8 });
      cleanup.push(async () => {
        await mailroom.close({ timeout: 500 });
        await admin.query(`DROP SCHEMA IF EXISTS ${q} CASCADE`);
      });
      await mailroom.migrate();
      const sql = async <R,>(text: string, params: unknown[] = []) => (await admin.query(text, params)).rows as R[];
      const GROUPS = ['g1', 'g2'];
      for (const group of GROUPS) {
        const consumer = mailroom.consumer({ group, handlers: { [happened.type]: () => {} } });
        await consumer.start();
        await consumer.stop(); // subscribed; its jobs stay in the queue for the checks
      }
      // The record of committed fan-outs, and a slow fan-out so that kills land inside the relay's transaction.
      await sql(`CREATE TABLE ${q}.fanout_log (queue text NOT NULL, event_id uuid NOT NULL, job_id uuid NOT NULL)`);
      await sql(`CREATE FUNCTION ${q}.log_fanout() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          INSERT INTO ${q}.fanout_log VALUES (NEW.queue, (NEW.payload->>'id')::uuid, NEW.id);
          RETURN NEW;
        END $$`);
      await sql(`CREATE FUNCTION ${q}.slow_fanout() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.03); RETURN NULL; END $$`);
      await sql(`CREATE TRIGGER a_log_fanout BEFORE INSERT ON ${q}.jobs FOR EACH ROW EXECUTE FUNCTION ${q}.log_fanout()`);
      await sql(`CREATE TRIGGER a_slow_fanout BEFORE INSERT ON ${q}.jobs FOR EACH STATEMENT EXECUTE FUNCTION ${q}.slow_fanout()`);

      const config: RelayProcessConfig = { url: url!, schema, lease: 800, batchSize: 15, pollInterval: 50, appPrefix: `rcrash${process.pid}` };
      const RELAYS = 2;
      for (let i = 0; i < RELAYS; i++) spawnRelay(config);
      await Promise.all([...children].map((c) => c.ready));

      // Producers: three at once, transactions of 1-4 events over 12 keys, held open a little so commit order
      // differs from xid and position order; one in eight rolled back.
      const committed: string[] = [];
      const rolledBack: string[] = [];
      let n = 0;
      let producing = true;
      let kills = 0;
      // Produce for at least 8 s, until 5 relays were killed (a replacement boots in a second or two, more
      // on a loaded machine) and 400 events committed (a loaded machine commits fewer a second), at most 60 s.
      const KILLS = 5;
      const minEnd = Date.now() + 8_000;
      const maxEnd = Date.now() + 60_000;
      const producer = async () => {
        while ((kills < KILLS || Date.now() < minEnd || committed.length < 400) && Date.now() < maxEnd) {
          const rollback = Math.random() < 0.125;
          const ids: string[] = [];
          await mailroom
            .transaction(async (tx) => {
              for (let i = randomInt(1, 4); i > 0; i--) ids.push((await mailroom.publish(happened, { n: n++ }, { tx, key: `key-${randomInt(0, 11)}` })).id);
              await sleep(randomInt(0, 25));
              if (rollback) throw new Error('rolled back on purpose');
            })
            .then(
              () => committed.push(...ids),
              () => rolledBack.push(...ids),
            );
          await sleep(randomInt(0, 10));
        }
      };
      // Killer: a relay that has run a while is SIGKILLed and replaced, so two run at once most of the time.
      const killer = async () => {
        while (producing) {
          await sleep(randomInt(400, 800));
          const live = [...children].filter((c) => !c.killedByTest && Date.now() - c.readyAt > 300);
          const victim = live[randomInt(0, live.length - 1)];
          if (!producing || !victim) continue;
          await kill(victim);
          kills++;
          spawnRelay(config);
        }
      };
      const killing = killer();
      await Promise.all([producer(), producer(), producer()]);
      producing = false;
      await killing;
      await Promise.all([...children].map((c) => c.ready));

      // Every committed event is delivered once the survivors catch up.
      await eventually(async () => (await mailroom.stats()).relay.internal?.unpublished === 0, 60_000, 'the relays to catch up');
      assert.deepEqual(unexpected, []);

      const jobs = await sql<{ queue: string; event: string; n: number }>(
        `SELECT queue, payload->>'id' AS event, count(*)::int AS n FROM ${q}.jobs GROUP BY queue, payload->>'id'`,
      );
      const logged = await sql<{ queue: string; event: string; n: number }>(
        `SELECT queue, event_id::text AS event, count(*)::int AS n FROM ${q}.fanout_log GROUP BY queue, event_id`,
      );
      const rolled = new Set(rolledBack);
      for (const [what, rows] of [['jobs', jobs], ['committed fan-outs', logged]] as const) {
        assert.deepEqual(rows.filter((r) => r.n !== 1).slice(0, 5), [], `${what}: an event fanned out more than once`);
        assert.deepEqual(rows.filter((r) => rolled.has(r.event)).slice(0, 5), [], `${what}: a rolled-back event`);
        for (const group of GROUPS) {
          const got = new Set(rows.filter((r) => r.queue === `consumer.${group}`).map((r) => r.event));
          const lost = committed.filter((id) => !got.has(id));
          assert.deepEqual(lost.slice(0, 5), [], `${what}: ${lost.length} committed events lost for ${group}`);
          assert.equal(got.size, committed.length, `${what}: unexpected events for ${group}`);
        }
      }
      // Per key, jobs queue (ordering_seq) in the events' position order, which is the key's commit order.
      const disorder = await sql<{ queue: string; key: string }>(
        `SELECT j.queue, j.ordering_key AS key FROM ${q}.jobs AS j JOIN ${q}.outbox AS o ON o.id = (j.payload->>'id')::uuid
          GROUP BY j.queue, j.ordering_key
         HAVING array_agg(o.position ORDER BY j.ordering_seq) <> array_agg(o.position ORDER BY o.position)`,
      );
      assert.deepEqual(disorder, []);
      const [{ deliveries }] = await sql<{ deliveries: number }>(`SELECT delivered::int AS deliveries FROM ${q}.relay_cursors WHERE target = 'internal'`) as [{ deliveries: number }];
      assert.equal(deliveries, committed.length, 'the cursor counted each committed event once');
      // The run was what it claims to be: relays killed repeatedly (each replacement boots in a second or two).
      assert.ok(kills >= KILLS, `only ${kills} kills`);
      assert.ok(committed.length > 300, `only ${committed.length} events committed`);
      assert.ok(rolledBack.length > 0);
      const leases = spawned.flatMap((c) => c.lines).filter((l) => l.event === 'lease-acquired').length;
      const batches = spawned.flatMap((c) => c.lines).filter((l) => l.event === 'delivered').length;
      t.diagnostic(`${committed.length} events committed, ${rolledBack.length} rolled back; ${kills} relays killed; ${leases} leases taken; ${batches} batches delivered`);
    });
  },
);
