import type { NamedQuery } from '../storage/driver.ts';
import { namedQueries } from '../storage/named.ts';

/** Statements of `ctx.step()` for one quoted schema. */
export interface StepQueries {
  find: NamedQuery;
  save: NamedQuery;
}

/** Builds the step statements for a quoted schema name. */
export function stepQueries(quotedSchema: string): StepQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    // $1 job id, $2 step name
    find: q('step_find', `SELECT result FROM ${s}.job_steps WHERE job_id = $1 AND name = $2`),
    // $1 job id, $2 step name, $3 result (json text), $4 attempt. The first result stored wins.
    save: q(
      'step_save',
      `WITH ins AS (
               INSERT INTO ${s}.job_steps (job_id, name, result, attempt) VALUES ($1, $2, $3::jsonb, $4)
               ON CONFLICT (job_id, name) DO NOTHING RETURNING result)
             SELECT result FROM ins
             UNION ALL
             SELECT result FROM ${s}.job_steps WHERE job_id = $1 AND name = $2 AND NOT EXISTS (SELECT 1 FROM ins)`,
    ),
  };
}
