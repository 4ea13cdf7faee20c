-- mailroom migration 1: the job table, its error history, and the wake-up trigger.
-- :"schema" is the schema name (psql: psql -v schema=mailroom -f 0001_jobs.sql).

CREATE TABLE :"schema".jobs (
  id uuid PRIMARY KEY,
  queue text NOT NULL,
  type text NOT NULL,
  state text NOT NULL,
  priority smallint NOT NULL DEFAULT 0,
  run_at timestamptz NOT NULL DEFAULT now(),
  attempt integer NOT NULL DEFAULT 0,
  max_attempts integer NOT NULL,
  claim_count integer NOT NULL DEFAULT 0,
  locked_until timestamptz,
  locked_by text,
  dedup_key text,
  correlation_id text,
  expires_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT now(),
  started_at timestamptz,
  finished_at timestamptz,
  dead_reason text,
  last_error jsonb,
  payload jsonb NOT NULL,
  CONSTRAINT jobs_state_check CHECK (state IN ('scheduled', 'available', 'active', 'retrying', 'completed', 'dead', 'cancelled')),
  CONSTRAINT jobs_attempt_check CHECK (attempt >= 0 AND max_attempts >= 1)
) WITH (fillfactor = 85);

COMMENT ON COLUMN :"schema".jobs.claim_count IS 'fencing token: incremented by every claim; every state change of an active job checks it';

-- Claim: the waiting jobs of a queue in priority, then run-time order.
CREATE INDEX jobs_claim_idx ON :"schema".jobs (queue, priority DESC, run_at, id)
  WHERE state IN ('available', 'scheduled', 'retrying');

-- Rescue: active jobs whose lease ran out.
CREATE INDEX jobs_lease_idx ON :"schema".jobs (locked_until) WHERE state = 'active';

-- Deduplication: one unfinished job per (type, key).
CREATE UNIQUE INDEX jobs_dedup_key_idx ON :"schema".jobs (type, dedup_key)
  WHERE dedup_key IS NOT NULL AND state IN ('scheduled', 'available', 'active', 'retrying');

-- Dead letters by queue and time.
CREATE INDEX jobs_dead_idx ON :"schema".jobs (queue, finished_at) WHERE state = 'dead';

CREATE INDEX jobs_correlation_idx ON :"schema".jobs (correlation_id) WHERE correlation_id IS NOT NULL;

-- One row per failed attempt: who ran it and when, category, message and stack, for the
-- dead-letter queue and the job's history. (The last attempt of a completed job is in its jobs row.)
CREATE TABLE :"schema".job_errors (
  job_id uuid NOT NULL REFERENCES :"schema".jobs (id) ON DELETE CASCADE,
  claim integer NOT NULL,
  attempt integer NOT NULL,
  worker text,
  started_at timestamptz,
  category text NOT NULL,
  message text NOT NULL,
  stack text,
  failed_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (job_id, claim)
);

-- Wake idle workers once per statement (not per row: NOTIFY per row is O(n^2) in one transaction).
-- A hint only: workers also poll.
CREATE FUNCTION :"schema".notify_new_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify(TG_TABLE_SCHEMA || '_wakeup', q.queue)
    FROM (SELECT DISTINCT queue FROM new_jobs WHERE state = 'available') AS q;
  RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_notify_new AFTER INSERT ON :"schema".jobs
  REFERENCING NEW TABLE AS new_jobs
  FOR EACH STATEMENT EXECUTE FUNCTION :"schema".notify_new_jobs();
