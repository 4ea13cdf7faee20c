/**
 * The statements of mailroom/http's idempotency store. Values are
 * parameters; only the validated schema name is spliced in.
 */
export interface IdempotencyQueries {
  /** $1 scope, $2 key: true when this transaction now holds the key (no other request with it runs). */
  readonly tryLock: string;
  /** $1 scope, $2 key, $3 retention ms: the recorded response, unless older than the retention. */
  readonly recorded: string;
  /** $1 scope, $2 key, $3 fingerprint, $4 status, $5 headers, $6 body: records a response (replacing an expired one). */
  readonly record: string;
  /** $1 retention ms, $2 batch size: deletes expired keys, oldest first. */
  readonly prune: string;
}

export function idempotencyQueries(quotedSchema: string): IdempotencyQueries {
  const t = `${quotedSchema}.idempotency_keys`;
  return {
    // A 64-bit hash of the pair, so that two scopes cannot share a lock by concatenation.
    tryLock: `SELECT pg_try_advisory_xact_lock(hashtextextended('mailroom.idempotency.' || $1::text || chr(1) || $2::text, 0)) AS locked`,
    recorded: `SELECT fingerprint, status, headers, body FROM ${t}
      WHERE scope = $1 AND key = $2 AND created_at >= now() - $3::bigint * interval '1 millisecond'`,
    record: `INSERT INTO ${t} (scope, key, fingerprint, status, headers, body) VALUES ($1, $2, $3, $4, $5::jsonb, $6)
      ON CONFLICT (scope, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, status = EXCLUDED.status,
        headers = EXCLUDED.headers, body = EXCLUDED.body, created_at = now()`,
    // By ctid (a TID scan): an IN over the two-column key can hash the whole table for every batch.
    prune: `DELETE FROM ${t} WHERE ctid = ANY (ARRAY(
      SELECT ctid FROM ${t} WHERE created_at < now() - $1::bigint * interval '1 millisecond' ORDER BY created_at LIMIT $2))`,
  };
}
