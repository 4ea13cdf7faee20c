import { ValidationError } from './errors.ts';
import type { Queryable } from './storage/driver.ts';

const MAX_ENTITY_LENGTH = 512;

/**
 * Records `version` for `entity` if it is newer than the newest recorded, and
 * says whether it was. Run it in the same transaction as the update it guards,
 * so an outdated event is skipped and a newer one applied exactly once:
 * `if (await ctx.isNewer(`customer:${id}`, event.version)) await ctx.tx.query(...)`.
 */
export async function advanceVersion(db: Queryable, quotedSchema: string, entity: string, version: number | bigint): Promise<boolean> {
  if (typeof entity !== 'string' || entity.length === 0 || entity.length > MAX_ENTITY_LENGTH) {
    throw new ValidationError(`versions: entity must be a non-empty string of at most ${MAX_ENTITY_LENGTH} characters`, [
      { path: 'entity', message: 'invalid' },
    ]);
  }
  if (!((typeof version === 'number' && Number.isSafeInteger(version)) || typeof version === 'bigint')) {
    throw new ValidationError(`versions: version of ${entity} must be an integer, got ${String(version)}`, [{ path: 'version', message: 'not an integer' }]);
  }
  const { rows } = await db.query(
    `INSERT INTO ${quotedSchema}.entity_versions AS v (entity, version) VALUES ($1, $2::bigint)
     ON CONFLICT (entity) DO UPDATE SET version = EXCLUDED.version, updated_at = now()
      WHERE v.version < EXCLUDED.version
     RETURNING 1`,
    [entity, String(version)],
  );
  return rows.length === 1;
}
