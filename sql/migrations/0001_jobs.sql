-- mailroom migration 1: the job table, its error history, and the wake-up trigger.
-- :"schema" is the schema name (psql: psql -v schema=mailroom -f 0001_jobs.sql).
-- Each migration records itself in :"schema".migrations, so files run by hand and
-- mailroom.migrate() can be mixed.

CREATE SCHEMA IF NOT EXISTS :"schema";
CREATE TABLE IF NOT EXISTS :"schema".migrations (
  version integer PRIMARY KEY,
  name text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
);

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
  ordering_key text,
  ordering_seq bigint,
  blocked boolean NOT NULL DEFAULT false,
  hold_key_when_dead boolean NOT NULL DEFAULT false,
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
COMMENT ON COLUMN :"schema".jobs.blocked IS 'waiting for an earlier job with the same ordering key to finish';

-- Claim: the waiting, unblocked jobs of a queue in priority, then run-time order.
CREATE INDEX jobs_claim_idx ON :"schema".jobs (queue, priority DESC, run_at, id)
  WHERE state IN ('available', 'scheduled', 'retrying') AND NOT blocked;

-- Rescue: active jobs whose lease ran out.
CREATE INDEX jobs_lease_idx ON :"schema".jobs (locked_until) WHERE state = 'active';

-- Deduplication: one unfinished job per (type, key).
CREATE UNIQUE INDEX jobs_dedup_key_idx ON :"schema".jobs (type, dedup_key)
  WHERE dedup_key IS NOT NULL AND state IN ('scheduled', 'available', 'active', 'retrying');

-- Deduplication window (retention.dedupKeys): completed jobs by (type, key).
CREATE INDEX jobs_completed_key_idx ON :"schema".jobs (type, dedup_key, finished_at)
  WHERE dedup_key IS NOT NULL AND state = 'completed';

-- Finished jobs by queue, state and time: dead-letter listing, retention, completions per minute.
CREATE INDEX jobs_finished_idx ON :"schema".jobs (state, finished_at, queue) WHERE state IN ('completed', 'dead', 'cancelled');

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

CREATE INDEX job_errors_failed_at_idx ON :"schema".job_errors (failed_at);

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

-- Per-key ordering. Jobs with an ordering key run one at a time per (queue, key), in enqueue order.
-- A job is inserted `blocked` when another job of its key still holds the key (unfinished, or dead
-- with hold_key_when_dead); when the holder lets go, the next job of the key (lowest ordering_seq)
-- is unblocked in the same transaction. One row per key serialises enqueues and releases of that
-- key; each trigger statement after taking that lock sees every committed job of the key, so no
-- job is missed and no two run at once. Only jobs with an ordering key pay for any of this.
CREATE TABLE :"schema".ordering_keys (
  queue text NOT NULL,
  key text NOT NULL,
  touched_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (queue, key)
);

CREATE SEQUENCE :"schema".jobs_ordering_seq;

CREATE INDEX jobs_ordering_idx ON :"schema".jobs (queue, ordering_key, ordering_seq)
  WHERE ordering_key IS NOT NULL AND state NOT IN ('completed', 'cancelled');

CREATE FUNCTION :"schema".ordering_acquire() RETURNS trigger LANGUAGE plpgsql
  SET search_path = :"schema" AS $$
BEGIN
  IF TG_OP = 'UPDATE' AND (
       (OLD.state IN ('scheduled', 'available', 'active', 'retrying') OR (OLD.state = 'dead' AND OLD.hold_key_when_dead))
       OR NOT (NEW.state IN ('scheduled', 'available', 'active', 'retrying') OR (NEW.state = 'dead' AND NEW.hold_key_when_dead))) THEN
    RETURN NEW; -- only a job taking its key up again (a retried dead or cancelled job) queues behind the key
  END IF;
  INSERT INTO ordering_keys AS k (queue, key) VALUES (NEW.queue, NEW.ordering_key)
    ON CONFLICT (queue, key) DO UPDATE SET touched_at = now();
  NEW.ordering_seq := nextval('jobs_ordering_seq');
  NEW.blocked := EXISTS (
    SELECT 1 FROM jobs AS j
     WHERE j.queue = NEW.queue AND j.ordering_key = NEW.ordering_key AND j.id <> NEW.id
       AND (j.state IN ('scheduled', 'available', 'active', 'retrying') OR (j.state = 'dead' AND j.hold_key_when_dead)));
  RETURN NEW;
END;
$$;

CREATE FUNCTION :"schema".ordering_release() RETURNS trigger LANGUAGE plpgsql
  SET search_path = :"schema" AS $$
DECLARE
  next_id uuid;
BEGIN
  IF NOT (OLD.state IN ('scheduled', 'available', 'active', 'retrying') OR (OLD.state = 'dead' AND OLD.hold_key_when_dead))
     OR (NEW.state IN ('scheduled', 'available', 'active', 'retrying') OR (NEW.state = 'dead' AND NEW.hold_key_when_dead)) THEN
    RETURN NULL; -- this job did not let go of its key
  END IF;
  INSERT INTO ordering_keys AS k (queue, key) VALUES (NEW.queue, NEW.ordering_key)
    ON CONFLICT (queue, key) DO UPDATE SET touched_at = now();
  IF EXISTS (
    SELECT 1 FROM jobs AS j
     WHERE j.queue = NEW.queue AND j.ordering_key = NEW.ordering_key AND NOT j.blocked
       AND (j.state IN ('scheduled', 'available', 'active', 'retrying') OR (j.state = 'dead' AND j.hold_key_when_dead))) THEN
    RETURN NULL; -- another job already holds the key
  END IF;
  SELECT j.id INTO next_id FROM jobs AS j
   WHERE j.queue = NEW.queue AND j.ordering_key = NEW.ordering_key AND j.blocked
     AND j.state IN ('scheduled', 'available', 'retrying')
   ORDER BY j.ordering_seq LIMIT 1;
  IF next_id IS NOT NULL THEN
    UPDATE jobs SET blocked = false WHERE id = next_id;
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_wakeup', NEW.queue);
  END IF;
  RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_ordering_acquire BEFORE INSERT OR UPDATE OF state ON :"schema".jobs
  FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL)
  EXECUTE FUNCTION :"schema".ordering_acquire();

CREATE TRIGGER jobs_ordering_release AFTER UPDATE OF state ON :"schema".jobs
  FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL AND OLD.state IS DISTINCT FROM NEW.state)
  EXECUTE FUNCTION :"schema".ordering_release();

INSERT INTO :"schema".migrations (version, name) VALUES (1, 'jobs');
