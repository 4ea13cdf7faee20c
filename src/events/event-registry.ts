import { ValidationError } from '../errors.ts';
import type { EventDefinition } from './define-event.ts';

const definitions = new Map<string, EventDefinition<unknown, unknown>>();

/**
 * Remembers an event definition by type and version. Defining the same pair
 * again with the same schema and source returns the first definition; with a
 * different one it is an error (two meanings of one version).
 */
export function registerEvent(def: EventDefinition<unknown, unknown>): EventDefinition<unknown, unknown> {
  const id = `${def.type}@${def.version}`;
  const existing = definitions.get(id);
  if (existing) {
    if (existing.schema === def.schema && existing.source === def.source) return existing;
    throw new ValidationError(
      `event ${def.type} version ${def.version} is already defined with a different ${existing.schema !== def.schema ? 'schema' : 'source'}; a changed payload is a new version (additive changes) or a new type (breaking changes)`,
      [{ path: 'version', message: 'already defined' }],
    );
  }
  definitions.set(id, def);
  return def;
}

/** The definition registered for a type and version, if any. */
export function findEvent(type: string, version: number): EventDefinition<unknown, unknown> | undefined {
  return definitions.get(`${type}@${version}`);
}

/** True when the exact definition object was made by defineEvent in this process. */
export function isRegisteredEvent(def: EventDefinition<unknown, unknown>): boolean {
  return definitions.get(`${def.type}@${def.version}`) === def;
}
