-- mailroom migration 6: per-key ordering at the cost of an index probe, not a scan of the key.
-- (Migration 1 has the tables and the trigger functions; see docs/ORDERING.md.)
--
-- A job *holds* its ordering key while it is unfinished and not blocked, or dead with
-- hold_key_when_dead. The release trigger asks "does another job still hold this key?": the
-- holder index answers with one probe, where the old query walked every unfinished job of the
-- key (a key with 200 waiting jobs cost 200 heap reads per completion). The triggers' WHEN
-- clauses now name the exact transitions they handle, so a claim (waiting -> active, the key
-- stays held) calls no trigger function at all.

CREATE INDEX jobs_ordering_holder_idx ON :"schema".jobs (queue, ordering_key)
  WHERE ordering_key IS NOT NULL AND NOT blocked
    AND (state IN ('scheduled', 'available', 'active', 'retrying') OR (state = 'dead' AND hold_key_when_dead));

DROP TRIGGER jobs_ordering_acquire ON :"schema".jobs;
DROP TRIGGER jobs_ordering_release ON :"schema".jobs;

-- A new job queues behind its key.
CREATE TRIGGER jobs_ordering_acquire BEFORE INSERT ON :"schema".jobs
  FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL)
  EXECUTE FUNCTION :"schema".ordering_acquire();

-- A finished job taking its key up again (a retried dead or cancelled job) queues behind it too.
CREATE TRIGGER jobs_ordering_retake BEFORE UPDATE OF state ON :"schema".jobs
  FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL
    AND NOT (OLD.state IN ('scheduled', 'available', 'active', 'retrying') OR (OLD.state = 'dead' AND OLD.hold_key_when_dead))
    AND (NEW.state IN ('scheduled', 'available', 'active', 'retrying') OR (NEW.state = 'dead' AND NEW.hold_key_when_dead)))
  EXECUTE FUNCTION :"schema".ordering_acquire();

-- A job letting go of its key hands it to the next job of the key.
CREATE TRIGGER jobs_ordering_release AFTER UPDATE OF state ON :"schema".jobs
  FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL
    AND (OLD.state IN ('scheduled', 'available', 'active', 'retrying') OR (OLD.state = 'dead' AND OLD.hold_key_when_dead))
    AND NOT (NEW.state IN ('scheduled', 'available', 'active', 'retrying') OR (NEW.state = 'dead' AND NEW.hold_key_when_dead)))
  EXECUTE FUNCTION :"schema".ordering_release();

-- The release in one statement after the key lock: unblock the next job of the key unless another
-- job still holds it. (Was: a holder check, a lookup and an update, three statements per release.)
CREATE OR REPLACE FUNCTION :"schema".ordering_release() RETURNS trigger LANGUAGE plpgsql
  SET search_path = :"schema" AS $$
BEGIN
  IF NOT (OLD.state IN ('scheduled', 'available', 'active', 'retrying') OR (OLD.state = 'dead' AND OLD.hold_key_when_dead))
     OR (NEW.state IN ('scheduled', 'available', 'active', 'retrying') OR (NEW.state = 'dead' AND NEW.hold_key_when_dead)) THEN
    RETURN NULL; -- this job did not let go of its key
  END IF;
  INSERT INTO ordering_keys AS k (queue, key) VALUES (NEW.queue, NEW.ordering_key)
    ON CONFLICT (queue, key) DO UPDATE SET touched_at = now();
  UPDATE jobs SET blocked = false
   WHERE id = (SELECT j.id FROM jobs AS j
                WHERE j.queue = NEW.queue AND j.ordering_key = NEW.ordering_key AND j.blocked
                  AND j.state IN ('scheduled', 'available', 'retrying')
                ORDER BY j.ordering_seq LIMIT 1)
     AND NOT EXISTS (
       SELECT 1 FROM jobs AS h
        WHERE h.queue = NEW.queue AND h.ordering_key = NEW.ordering_key AND NOT h.blocked
          AND (h.state IN ('scheduled', 'available', 'active', 'retrying') OR (h.state = 'dead' AND h.hold_key_when_dead)));
  IF FOUND THEN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_wakeup', NEW.queue);
  END IF;
  RETURN NULL;
END;
$$;

INSERT INTO :"schema".migrations (version, name) VALUES (6, 'ordering_triggers');
