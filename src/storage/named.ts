import type { NamedQuery } from './driver.ts';

/**
 * Makes named statements for one quoted schema: the name carries the schema,
 * so one connection can hold prepared statements of several schemas.
 *
 * @example
 * const q = namedQueries('"mailroom"'); q('claim', 'SELECT …') // { name: 'mailroom_claim_mailroom', text: 'SELECT …' }
 */
export function namedQueries(quotedSchema: string): (name: string, text: string) => NamedQuery {
  const tag = quotedSchema.slice(1, -1);
  return (name, text) => ({ name: `mailroom_${name}_${tag}`, text });
}
