import type { NamedQuery } from '../storage/driver.ts';
import { namedQueries } from '../storage/named.ts';

/** Statements that retire a relay target, for one quoted schema. */
export interface RemoveTargetQueries {
  lockCursor: NamedQuery;
  internalGroups: NamedQuery;
  deleteParked: NamedQuery;
  deleteCursor: NamedQuery;
}

/** Builds the target-removal statements for a quoted schema name. */
export function removeTargetQueries(quotedSchema: string): RemoveTargetQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    // $1 target: its cursor row, locked (a relay's next round waits, then finds no row), and whether a relay holds it now.
    lockCursor: q(
      'remove_target_lock',
      `SELECT holder, COALESCE(holder IS NOT NULL AND locked_until > now(), false) AS held
         FROM ${s}.relay_cursors WHERE target = $1 FOR UPDATE`,
    ),
    // Groups of internal events: the internal target feeds them.
    internalGroups: q('remove_target_internal_groups', `SELECT name FROM ${s}.consumer_groups WHERE source IS NULL ORDER BY name`),
    // $1 target
    deleteParked: q('remove_target_parked', `DELETE FROM ${s}.relay_parked WHERE target = $1`),
    deleteCursor: q('remove_target_cursor', `DELETE FROM ${s}.relay_cursors WHERE target = $1`),
  };
}
