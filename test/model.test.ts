/**
 * Model-based tests of the job state machine (issue #8): fast-check generates
 * sequences of enqueue, claim, complete, fail, snooze, heartbeat, lease expiry,
 * rescue, cancel, retry, replay and prune; each runs against the database (the
 * statements a worker runs, and the public API) and against the in-memory model
 * of test/helpers/job-model.ts, and everything is compared after each command.
 * A failure shrinks to a minimal sequence; the ones found are the regression
 * tests at the end of this file.
 *
 * MODEL_RUNS=500 node --import tsx --test test/model.test.ts   # a longer run
 */
import { test } from 'node:test';
import fc from 'fast-check';
import { createMailroom, defineJob } from '../src/index.ts';
import { quoteSchema } from '../src/identifiers.ts';
import { jobQueries } from '../src/jobs/queries.ts';
import { connect } from '../src/storage/connect.ts';
import { testDatabases, type TestDatabase } from './helpers/databases.ts';
import {
  Cancel,
  Claim,
  Enqueue,
  Fail,
  Prune,
  jobCommands,
  MODEL_QUEUE,
  ReplayAll,
  Retry,
  type RealSystem,
} from './helpers/job-commands.ts';
import { JobModel, MAX_ATTEMPTS } from './helpers/job-model.ts';

// Backoff 0: a transient failure is due again at once (a Retry-After of 1h makes it wait), and the
// retry horizon is 0, so a pruning mailroom may keep dead jobs for only a second.
const noBackoff = { base: '0ms', max: '0ms' } as const;
const plain = defineJob<{ n: number }>('model.plain', { queue: MODEL_QUEUE, retry: { maxAttempts: MAX_ATTEMPTS.plain, backoff: noBackoff } });
const hold = defineJob<{ n: number }>('model.hold', {
  queue: MODEL_QUEUE,
  retry: { maxAttempts: MAX_ATTEMPTS.hold, backoff: noBackoff },
  ordering: { onDead: 'hold' },
});

const RUNS = Number(process.env.MODEL_RUNS ?? 25);

/** One schema per property: opened once, emptied before each run. */
async function openSystem(db: TestDatabase, dedupWindow: boolean, after: (fn: () => Promise<void>) => void): Promise<RealSystem & { reset(): Promise<void> }> {
  const { mailroom, schema, sql } = await db.open(dedupWindow ? { retention: { dedupKeys: '1h', completed: { age: '1h' } } } : {});
  const handle = await db.handle();
  const pruner = await createMailroom({ database: handle, schema, retention: { completed: { age: '1s' }, dead: { age: '1s' } } });
  const driver = await connect(handle, 2);
  after(async () => {
    await pruner.close();
    await driver.close();
  });
  const s = quoteSchema(schema);
  await sql(`CREATE TABLE ${s}.model_effects (job_id uuid NOT NULL, claim int NOT NULL)`);
  const system = {
    mailroom,
    pruner,
    driver,
    queries: jobQueries(s),
    s,
    sql,
    defs: { plain, hold },
    claims: new Map(),
    async reset() {
      system.claims.clear();
      await sql(`TRUNCATE ${s}.jobs, ${s}.job_errors, ${s}.ordering_keys, ${s}.dead_letter_replays, ${s}.dead_letter_replay_jobs, ${s}.model_effects CASCADE`);
    },
  };
  return system;
}

for (const db of testDatabases()) {
  for (const dedupWindow of [false, true]) {
    test(`${db.name}: the job state machine follows its model${dedupWindow ? ' (with a dedup key window)' : ''}`, async (t) => {
      const system = await openSystem(db, dedupWindow, (fn) => t.after(fn));
      await fc.assert(
        fc.asyncProperty(fc.commands(jobCommands(), { maxCommands: 40, size: 'medium' }), async (commands) => {
          await system.reset();
          await fc.asyncModelRun(() => ({ model: new JobModel(dedupWindow), real: system }), commands);
          if (process.env.MODEL_DEBUG) console.log(String(commands));
        }),
        { numRuns: RUNS, includeErrorInReport: true },
      );
    });
  }
}

/** Runs one fixed command sequence (a shrunk counterexample) on each database. */
function regression(name: string, commands: () => fc.AsyncCommand<JobModel, RealSystem>[], dedupWindow = false): void {
  for (const db of testDatabases()) {
    test(`${db.name}: ${name}`, async (t) => {
      const system = await openSystem(db, dedupWindow, (fn) => t.after(fn));
      await fc.asyncModelRun(() => ({ model: new JobModel(dedupWindow), real: system }), commands());
    });
  }
}

// Found by the property (shrunk to the cancelled variant below): retrying a dead or cancelled job
// whose dedup key an unfinished job holds now failed with PostgreSQL's raw `duplicate key value
// violates unique constraint "jobs_dedup_key_idx"`. Now a MailroomError names the holder.
regression('jobs.retry of a dead job whose dedup key is held again says which job holds it', () => [
  new Enqueue('plain', 'k1', null, false),
  new Claim(1),
  new Fail(0, 'permanent'),
  new Enqueue('plain', 'k1', null, false),
  new Retry(0),
]);

regression('jobs.retry of a cancelled job whose dedup key is held again says which job holds it', () => [
  new Enqueue('plain', 'k1', null, false),
  new Cancel(0),
  new Enqueue('plain', 'k1', null, false),
  new Retry(0),
]);

// Found while fixing the above (the same unique index, reached through a replay by filter): two dead
// jobs of one type with the same free dedup key made the whole replay fail; now the first to have
// died is replayed and the other skipped (counted in `skipped`).
regression('a replay by filter of two dead jobs sharing a dedup key replays one and skips the other', () => [
  new Enqueue('plain', 'k1', null, false),
  new Claim(1),
  new Fail(0, 'permanent'),
  new Enqueue('plain', 'k1', null, false),
  new Claim(1),
  new Fail(1, 'permanent'),
  new ReplayAll(),
]);

// Found by the property in session 10 (against the model as it was): a dead job holding its
// ordering key (onDead: 'hold') is pruned by dead-letter retention. Until migration 14 nothing then
// held the key and the job behind it stayed blocked until a write to it (here `jobs.retry` of it,
// job #0 once the dead one is gone) let the key go to it; since migration 14 the deletion hands the
// key on, and the model checks after the prune that the job behind is no longer blocked.
regression('a dead holder pruned by retention hands its key to the job behind it', () => [
  new Enqueue('hold', null, 'o1', false),
  new Claim(1),
  new Fail(0, 'permanent'),
  new Enqueue('plain', null, 'o1', false),
  new Prune(),
  new Retry(0),
], true);
