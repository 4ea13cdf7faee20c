-- mailroom migration 17: responses to HTTP requests that carried an Idempotency-Key (mailroom/http).
--
-- The first request with a key runs its handler in a transaction that also writes this row, so the
-- handler's database work, its jobs and events, and the recorded response commit together or not at
-- all. A repeat of the request (same scope, key and fingerprint) gets the recorded response without
-- running the handler again. Rows older than the middleware's retention are replaced by the next
-- request with their key and deleted by prune(). See docs/HTTP.md.
CREATE TABLE :"schema".idempotency_keys (
  scope text NOT NULL,
  key text NOT NULL,
  fingerprint text NOT NULL,
  status integer NOT NULL,
  headers jsonb NOT NULL,
  body bytea NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (scope, key)
);

CREATE INDEX idempotency_keys_created_at ON :"schema".idempotency_keys (created_at);

INSERT INTO :"schema".migrations (version, name) VALUES (17, 'idempotency_keys');
