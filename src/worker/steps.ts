import { MailroomError, ValidationError } from '../errors.ts';
import type { StepQueries } from '../jobs/step-queries.ts';
import { serializePayload } from '../payload.ts';
import type { Driver } from '../storage/driver.ts';
import type { ClaimedRow } from './types.ts';

const STEP_NAME = /^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$/;
const MAX_STEP_RESULT_BYTES = 1024 * 1024;

function checkStepName(name: unknown): asserts name is string {
  if (typeof name !== 'string' || !STEP_NAME.test(name)) {
    throw new ValidationError(`ctx.step/idempotencyKey: name ${JSON.stringify(name)} is not valid; use 1-128 letters, digits, '_', '.', ':' or '-'`, [
      { path: 'name', message: 'invalid name' },
    ]);
  }
}

/**
 * `ctx.step(name, fn)`: runs `fn` once per job and stores its (JSON) result in
 * its own short transaction, so that a retry of the job gets the stored result
 * instead of running `fn` again. This is "send, then record": a crash between
 * `fn` finishing and the record being written re-runs `fn` on the retry, which
 * is why `fn` should pass `ctx.idempotencyKey(name)` to the provider it calls.
 */
export async function runStep<T>(
  driver: Driver,
  queries: StepQueries,
  row: ClaimedRow,
  name: string,
  fn: () => T | Promise<T>,
  txOpen: boolean,
): Promise<T> {
  checkStepName(name);
  if (typeof fn !== 'function') throw new TypeError(`ctx.step("${name}", fn): fn must be a function`);
  if (txOpen && driver.kind === 'pglite') {
    throw new MailroomError(
      `ctx.step("${name}") was called while ctx.tx is open on the embedded database (PGlite has one connection, held by ctx.tx); call ctx.step before the first ctx.tx query`,
    );
  }
  const found = await driver.run<{ result: T }>(queries.find, [row.id, name]);
  if (found.rows[0]) return found.rows[0].result;
  const value = await fn();
  const text = serializePayload(value === undefined ? null : value, MAX_STEP_RESULT_BYTES, `step ${name} of job ${row.type}`);
  const saved = await driver.run<{ result: T }>(queries.save, [row.id, name, text, row.attempt]);
  // Another attempt (a stale worker) may have stored its result first: every attempt then continues with the same one.
  return saved.rows[0] ? saved.rows[0].result : (JSON.parse(text) as T);
}

/**
 * `ctx.idempotencyKey(name)`: the same string for every attempt of one job,
 * different for every job and name; hand it to providers (payment, email) as
 * their idempotency key.
 */
export function idempotencyKey(row: ClaimedRow, name: string): string {
  checkStepName(name);
  return `mailroom:${row.queue}:${row.id}:${name}`;
}
