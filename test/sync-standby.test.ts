/**
 * A COMMIT that waits for a synchronous standby which never answers (the
 * standby down, `synchronous_commit = on`): PostgreSQL holds the COMMIT until
 * the standby confirms it, for good. A stop that cancels it must not leave the
 * connection busy, or `mailroom.close()` waits for it for good. Cancelled,
 * such a COMMIT returns: committed on this server, with PostgreSQL's warning
 * that the standby may not have it.
 *
 * Runs on a private cluster (test/reliability/pg-cluster.ts: setting
 * `synchronous_standby_names` on the machine's shared server would hold every
 * other test's commits). Runs when TEST_DATABASE_URL is set (the opt-in to
 * PostgreSQL tests) and the server binaries are installed; under CI a missing
 * piece fails instead of skipping.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import pg from 'pg';
import { createMailroom, defineEvent, defineJob, type Mailroom, type RelayTarget } from '../src/index.ts';
import { checkServer, standbysRequired } from '../src/storage/server-check.ts';
import { within } from '../src/time-limit.ts';
import { runMailroom } from './helpers/cli.ts';
import { PgCluster, privateClusterUnavailable } from './reliability/pg-cluster.ts';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const missing = !process.env.TEST_DATABASE_URL ? 'TEST_DATABASE_URL is not set (the opt-in to the PostgreSQL tests)' : privateClusterUnavailable();
const skip = missing && !process.env.CI ? missing : false;

/** Fails naming `what` unless `promise` settles within `ms` (so that a hang still runs the clean-up). */
async function settlesWithin(promise: Promise<unknown>, ms: number, what: string): Promise<void> {
  assert.ok(await within(promise.then(() => true), ms, false), `${what} did not resolve within ${ms} ms`);
}

/** Polls `check` every 25 ms until it is true; fails naming `what` after `ms`. */
async function until(check: () => Promise<boolean>, what: string, ms = 15_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    assert.ok(Date.now() < deadline, `${what} within ${ms} ms`);
    await sleep(25);
  }
}

/** What each test gets: a mailroom on a private cluster, a superuser connection, the errors reported. */
interface Standby {
  mailroom: Mailroom;
  admin: pg.Client;
  /** The cluster's URL. */
  url: string;
  errors: unknown[];
  /** From now on every transaction that writes waits at its COMMIT for a standby named ghost, which never connects. */
  holdCommits(): Promise<void>;
  /**
   * Once `entered` (the work is under way), holds the commits and lets the work go on (`release`)
   * until its COMMIT waits; then stops it (`stop`, timeout 1 s) and closes the mailroom, each
   * within its limit; then nothing may wait for the standby.
   */
  stopWhileCommitWaits(entered: Promise<void>, release: () => void, stop: () => Promise<void>): Promise<void>;
  /** The error messages reported so far. */
  messages(): string[];
}

/** Runs `fn` with a mailroom on a fresh private cluster (schema `standby`); removes the cluster after. */
async function onPrivateCluster(fn: (t: Standby) => Promise<void>): Promise<void> {
  if (missing) throw new Error(`this test cannot run under CI: ${missing}`);
  const cluster = await PgCluster.start();
  const admin = new pg.Client({ connectionString: cluster.url('sync-standby-admin') });
  let open: Mailroom | undefined;
  try {
    await admin.connect();
    const mailroom = await createMailroom({ database: cluster.url('sync-standby-test'), schema: 'standby' });
    open = mailroom;
    await mailroom.migrate();
    const errors: unknown[] = [];
    mailroom.on('error', ({ error }) => void errors.push(error));
    await fn({
      mailroom,
      admin,
      url: cluster.url(),
      errors,
      async holdCommits() {
        await admin.query(`ALTER SYSTEM SET synchronous_standby_names = 'ghost'`);
        await admin.query('SELECT pg_reload_conf()');
        await until(async () => (await admin.query('SHOW synchronous_standby_names')).rows[0].synchronous_standby_names === 'ghost', 'the setting in effect');
      },
      async stopWhileCommitWaits(entered, release, stop) {
        await entered;
        await this.holdCommits();
        release();
        const waiting = async () =>
          (await admin.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND application_name = 'sync-standby-test'`)).rows[0].n > 0;
        await until(waiting, "one of mailroom's COMMITs waiting for the standby");
        await settlesWithin(stop(), 6_000, 'stop() with a timeout of 1 s');
        open = undefined;
        await settlesWithin(mailroom.close({ timeout: 1000 }), 5_000, 'close() after the stop');
        const { rows } = await admin.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event = 'SyncRep'`);
        assert.equal(rows[0].n, 0, 'a COMMIT still waits for the standby after close()');
      },
      messages: () => errors.map((e) => (e instanceof Error ? e.message : String(e))),
    });
  } finally {
    await open?.close({ timeout: 1000 }).catch(() => {});
    await admin.query('ALTER SYSTEM RESET synchronous_standby_names').catch(() => {});
    await admin.end().catch(() => {});
    await cluster.stop();
  }
}

describe('a COMMIT waiting for a synchronous standby that never answers (a private PostgreSQL cluster)', { skip }, () => {
  it("a worker's stop cancels the wait: the handler's work and the completion are committed on the server, and close() does not hang", { timeout: 90_000 }, async () => {
    await onPrivateCluster(async (t) => {
      await t.admin.query('CREATE TABLE standby.effects (job_id uuid PRIMARY KEY)');
      const job = defineJob<{ n: number }>('standby.effect', { queue: 'standby' });
      const id = await t.mailroom.enqueue(job, { n: 1 });
      let began!: () => void;
      const running = new Promise<void>((resolve) => (began = resolve));
      let go!: () => void;
      const goes = new Promise<void>((resolve) => (go = resolve));
      const worker = t.mailroom.worker({
        queues: ['standby'],
        maintenance: false,
        pollInterval: '50ms',
        handlers: {
          [job.name]: async (j, ctx) => {
            began();
            await goes;
            await ctx.tx.query('INSERT INTO standby.effects (job_id) VALUES ($1)', [j.id]);
          },
        },
      });
      await worker.start();
      await t.stopWhileCommitWaits(running, go, () => worker.stop({ timeout: '1s' }));
      // The cancelled COMMIT committed on this server: the effect once, the job completed with it.
      const { rows: effects } = await t.admin.query('SELECT job_id FROM standby.effects');
      assert.deepEqual(effects.map((r) => r.job_id), [id], "the handler's work committed once");
      const { rows: jobs } = await t.admin.query('SELECT state FROM standby.jobs WHERE id = $1', [id]);
      assert.equal(jobs[0].state, 'completed', 'the completion committed with it');
      assert.ok(
        t.messages().some((m) => /gave up on its writes .*a COMMIT cancelled while it waited for a standby is committed on this server/.test(m)),
        `the stop reported what it cut short: ${t.messages().join(' | ')}`,
      );
    });
  });

  it("a relay's stop cancels the wait of its round's COMMIT, and close() does not hang", { timeout: 90_000 }, async () => {
    await onPrivateCluster(async (t) => {
      const noted = defineEvent<{ n: number }>('standby.noted', { version: 1 });
      await t.mailroom.publish(noted, { n: 1 });
      let entered!: () => void;
      const publishing = new Promise<void>((resolve) => (entered = resolve));
      let go!: () => void;
      const goes = new Promise<void>((resolve) => (go = resolve));
      const sent: string[] = [];
      const sink: RelayTarget = {
        name: 'sink',
        publish: async (events) => {
          entered();
          await goes;
          for (const e of events) sent.push(e.position);
        },
      };
      const relay = t.mailroom.relay({ to: [sink], internal: false, pollInterval: 50 });
      await relay.start();
      await t.stopWhileCommitWaits(publishing, go, () => relay.stop({ timeout: '1s' }));
      assert.equal(sent.length, 1, 'the event was published once');
      assert.ok(
        t.messages().some((m) => /the round in flight for target sink did not end .*a COMMIT that waited for a standby is committed on this server/.test(m)),
        `the stop reported what it cut short: ${t.messages().join(' | ')}`,
      );
    });
  });

  it('mailroom doctor reports a synchronous standby that is not connected (sync-standby-missing, exit 1), and nothing once the setting is cleared', { timeout: 90_000 }, async () => {
    await onPrivateCluster(async (t) => {
      const read = async <R,>(sql: string, params?: unknown[]) => (await t.admin.query(sql, params)).rows as R[];
      assert.deepEqual(await checkServer(read, 'the cluster'), [], 'no standby asked for');
      await t.holdCommits();
      const [warning, ...others] = await checkServer(read, 'the cluster');
      assert.deepEqual(others, []);
      assert.equal(warning?.code, 'sync-standby-missing');
      assert.match(warning!.message, /^synchronous_standby_names is 'ghost' \(1 synchronous standby\) and synchronous_commit is on, but 0 synchronous standbys are connected/);
      const args = ['doctor', '--database', t.url, '--schema', 'standby', '--json'];
      const run = await runMailroom(args, { timeoutMs: 60_000 });
      assert.equal(run.code, 1, run.stdout + run.stderr);
      const report = JSON.parse(run.stdout) as { warnings: { code: string; check: string }[] };
      assert.deepEqual(report.warnings.map((w) => w.code), ['sync-standby-missing']);
      assert.equal(report.warnings[0]!.check, 'database schema standby');
      // synchronous_commit = local in a session does not wait: nothing to report for it.
      await t.admin.query('SET synchronous_commit = local');
      assert.deepEqual(await checkServer(read, 'the cluster'), []);
      await t.admin.query('RESET synchronous_commit');
      await t.admin.query(`ALTER SYSTEM SET synchronous_standby_names = ''`);
      await t.admin.query('SELECT pg_reload_conf()');
      const cleared = async () => (await read<{ names: string }>(`SELECT current_setting('synchronous_standby_names') AS names`))[0]!.names === '';
      await until(cleared, 'the setting cleared');
      const sound = await runMailroom(args, { timeoutMs: 60_000 });
      assert.equal(sound.code, 0, sound.stdout + sound.stderr);
    });
  });

  it('how many standbys synchronous_standby_names asks for', () => {
    assert.equal(standbysRequired('ghost'), 1);
    assert.equal(standbysRequired('a, b'), 1);
    assert.equal(standbysRequired('*'), 1);
    assert.equal(standbysRequired('FIRST 2 (a, b, c)'), 2);
    assert.equal(standbysRequired('any 3 (a, b, c)'), 3);
    assert.equal(standbysRequired('2 (a, b)'), 2);
  });
});
