/**
 * The statements of mailroom/testing: what a test reads back (jobs of a type,
 * events of a type) and how much work a drain still waits for. Values are
 * parameters; only the validated schema name is spliced in.
 */
import { WAITING_UNBLOCKED } from '../jobs/queries.ts';
import { quoteSchema } from '../identifiers.ts';
import type { Mailroom } from '../mailroom.ts';

export interface TestingQueries {
  /** $1 type, $2 states: the jobs of a type in those states, oldest first. */
  readonly jobsOfType: string;
  /** $1 type: the outbox events of a type still retained, in publish order. */
  readonly eventsOfType: string;
  /** $1 queues, $2 whether later jobs count: jobs running under a live lease, and jobs due (waiting, not behind an ordering key, run time reached unless $2). */
  readonly workLeft: string;
  /** $1 queues: moves the run time of every job waiting for a later time (scheduled, retrying, snoozed) to now. */
  readonly runScheduledNow: string;
}

export function testingQueries(quotedSchema: string): TestingQueries {
  return {
    jobsOfType: `SELECT id::text, queue, state, payload AS data, priority, run_at, attempt, dedup_key, ordering_key, correlation_id, created_at
       FROM ${quotedSchema}.jobs WHERE type = $1 AND state = ANY ($2::text[]) ORDER BY created_at, id`,
    eventsOfType: `SELECT id::text, position::text, version, subject, data, correlation_id, causation_id, traceparent, time
       FROM ${quotedSchema}.outbox WHERE type = $1 ORDER BY position`,
    workLeft: `SELECT count(*) FILTER (WHERE j.state = 'active')::int AS active, count(*) FILTER (WHERE j.state <> 'active')::int AS due
       FROM ${quotedSchema}.jobs j
      WHERE j.queue = ANY ($1::text[])
        AND ((j.state = 'active' AND j.locked_until > now()) OR (${WAITING_UNBLOCKED('j')} AND (j.run_at <= now() OR $2::boolean)))`,
    runScheduledNow: `UPDATE ${quotedSchema}.jobs j SET run_at = now()
      WHERE j.queue = ANY ($1::text[]) AND ${WAITING_UNBLOCKED('j')} AND j.run_at > now()`,
  };
}

/** Runs one of these statements on the mailroom's database, in its schema; the rows. */
export async function runTestingQuery<R>(mailroom: Mailroom, statement: keyof TestingQueries, params: readonly unknown[]): Promise<R[]> {
  const text = testingQueries(quoteSchema(mailroom.schema))[statement];
  const { rows } = await mailroom.transaction((tx) => tx.query<R>(text, params));
  return rows;
}
