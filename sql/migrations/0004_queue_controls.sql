-- mailroom migration 4: limits shared by every process that works a queue.
-- A rate limit is a sliding window: at most rate_max claims in any rate_per_ms milliseconds,
-- tracked as the times of the most recent claims. concurrency caps active jobs of the queue.
-- paused_until backs the whole queue off (a handler threw RateLimitedError).

CREATE TABLE :"schema".queue_controls (
  queue text PRIMARY KEY,
  rate_max integer CHECK (rate_max >= 1),
  rate_per_ms bigint CHECK (rate_per_ms >= 1),
  recent_claims timestamptz[] NOT NULL DEFAULT '{}',
  concurrency integer CHECK (concurrency >= 1),
  paused_until timestamptz,
  updated_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO :"schema".migrations (version, name) VALUES (4, 'queue_controls');
