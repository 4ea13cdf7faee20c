/**
 * How often an idle worker claims: once a claim found less than it had room
 * for, new work announces itself (NOTIFY, the poll), so finishing a job
 * without an ordering key on a queue without shared limits is no reason to
 * claim again. It used to be: every job of a trickle cost a second, empty
 * claim.
 */
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { createMailroom, defineJob } from '../src/index.ts';
import { databaseUrl, uniqueSchema } from './helpers/databases.ts';
import { waitForEvents } from './helpers/events.ts';

const chore = defineJob<{ n: number }>('claims.chore', { queue: 'claims' });
const JOBS = 30;

describe('claims of an idle worker', { skip: databaseUrl ? false : 'needs TEST_DATABASE_URL' }, () => {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 6 });
  const schema = uniqueSchema('claims');
  after(async () => {
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await pool.end();
  });

  it('a trickle of jobs without ordering keys costs one claim per job, not two', async () => {
    const mailroom = await createMailroom({ database: pool, schema });
    await mailroom.migrate();
    let claims = 0;
    const query = pool.query.bind(pool) as (...args: unknown[]) => unknown;
    (pool as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
      const config = args[0] as { name?: string } | string;
      if (typeof config === 'object' && config.name?.startsWith('mailroom_claim_')) claims++;
      return query(...args);
    };
    const worker = mailroom.worker({ queues: ['claims'], concurrency: 4, handlers: { [chore.name]: async () => {} } });
    await worker.start();
    try {
      await new Promise((r) => setTimeout(r, 300)); // idle: registered for NOTIFY, settled
      const before = claims;
      for (let n = 0; n < JOBS; n++) {
        const done = waitForEvents(worker, 'completed', 1);
        await mailroom.enqueue(chore, { n });
        await done;
        await new Promise((r) => setTimeout(r, 20)); // the completion is written, the worker sleeps again
      }
      const perJob = (claims - before) / JOBS;
      // One claim per NOTIFY; a few more while the wake-up gate settles. Two per job before the change.
      assert.ok(perJob < 1.5, `${claims - before} claims for ${JOBS} jobs`);
    } finally {
      await worker.stop();
      await mailroom.close();
    }
  });
});
