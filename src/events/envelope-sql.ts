/**
 * The CloudEvents envelope of an outbox row, built by PostgreSQL as JSON text:
 * the same document as `toEnvelope(row)` (test/envelope-sql.test.ts compares
 * them), read by the relay and the consumers' backfill so that the envelope is
 * not parsed into objects and serialised again in Node for every event. The
 * payload is the stored jsonb's own text.
 */
import { RESERVED_ATTRIBUTES } from './envelope.ts';

/** The reserved attribute names as an SQL array literal (constants, never user input). */
const RESERVED_SQL = `ARRAY[${[...RESERVED_ATTRIBUTES].map((name) => `'${name}'`).join(', ')}]::text[]`;

/** `time` as RFC 3339 in UTC with milliseconds, as `Date#toISOString()` writes it. */
const timeSql = (o: string) => `to_char(${o}.time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`;

/**
 * The envelope's JSON text for the outbox row aliased `o`: optional attributes
 * left out when null, headers as extension attributes (reserved names
 * skipped), `data` last.
 */
function envelopeSql(o: string): string {
  return `concat('{"specversion":"1.0","id":', to_json(${o}.id::text), ',"source":', to_json(${o}.source), ',"type":', to_json(${o}.type),
      ',"time":"', ${timeSql(o)}, '","datacontenttype":"application/json","dataschema":', to_json('urn:mailroom:' || ${o}.type || ':v' || ${o}.version),
      ',"subject":' || to_json(${o}.subject) || ',"partitionkey":' || to_json(${o}.subject),
      ',"correlationid":' || to_json(${o}.correlation_id), ',"causationid":' || to_json(${o}.causation_id), ',"traceparent":' || to_json(${o}.traceparent),
      (SELECT string_agg(',' || to_json(h.key) || ':' || to_json(h.value), '') FROM jsonb_each_text(${o}.headers) AS h WHERE h.key <> ALL (${RESERVED_SQL})),
      ',"data":', ${o}.data::text, '}')`;
}

/**
 * The select list of a stored event (`StoredEventRow`) for the outbox row
 * aliased `o`: what a target needs without parsing the envelope, and the
 * envelope's text.
 *
 * @example
 * `SELECT ${storedEventColumns('o')} FROM outbox AS o`
 */
export function storedEventColumns(o: string): string {
  return `${o}.position::text AS position, ${o}.xid::text AS xid, ${o}.id::text AS id, ${o}.type, ${o}.subject,
          ${o}.correlation_id, ${o}.causation_id, ${o}.traceparent, ${timeSql(o)} AS time, ${envelopeSql(o)} AS body`;
}
