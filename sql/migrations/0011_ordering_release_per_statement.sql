-- mailroom migration 11: a key is let go of once per statement, not once per row.
-- (Migrations 1 and 6 have the rest of per-key ordering; see docs/ORDERING.md.)
--
-- The release used to be a row trigger: for every job that let go of its key it ran three
-- statements of its own (lock the key row, look for another holder, unblock the next job). A
-- worker's batched completion of 500 ordered jobs spent 2-4 times as long in that trigger as in
-- the completion itself. Now one statement trigger sees the statement's changed rows (transition
-- tables), finds the keys let go of, locks their rows in key order, and then, in a statement of
-- its own (a fresh snapshot, taken with the locks held, so it sees every committed job of those
-- keys), unblocks the next job of each key that no other job holds. The same work, set-based.
--
-- A statement that lets go of no key (claims, heartbeats, jobs without keys) pays for one look at
-- its changed rows. The key row is now locked, not updated, when a key is let go of: `touched_at`
-- says when a job last took the key, which is what pruning asks.

DROP TRIGGER jobs_ordering_release ON :"schema".jobs;
DROP FUNCTION :"schema".ordering_release();

CREATE FUNCTION :"schema".ordering_release() RETURNS trigger LANGUAGE plpgsql
  SET search_path = :"schema" AS $$
DECLARE
  released_count integer;
  locked_count integer;
  woken text;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM released_new WHERE ordering_key IS NOT NULL) THEN
    RETURN NULL; -- no job with a key changed (claims and completions of jobs without keys)
  END IF;
  -- The keys this statement's rows let go of: they held it before (unfinished and not blocked,
  -- or dead with hold_key_when_dead) and hold it no more.
  SELECT count(DISTINCT (n.queue, n.ordering_key)) INTO released_count
    FROM released_new AS n JOIN released_old AS o ON o.id = n.id
   WHERE n.ordering_key IS NOT NULL
     AND (o.state IN ('scheduled', 'available', 'active', 'retrying') OR (o.state = 'dead' AND o.hold_key_when_dead))
     AND NOT (n.state IN ('scheduled', 'available', 'active', 'retrying') OR (n.state = 'dead' AND n.hold_key_when_dead));
  IF released_count = 0 THEN
    RETURN NULL;
  END IF;
  -- Their rows, locked in key order (two statements cannot lock them crosswise)...
  SELECT count(*) INTO locked_count FROM (
    SELECT 1 FROM ordering_keys AS k
     WHERE (k.queue, k.key) IN (
       SELECT n.queue, n.ordering_key
         FROM released_new AS n JOIN released_old AS o ON o.id = n.id
        WHERE n.ordering_key IS NOT NULL
          AND (o.state IN ('scheduled', 'available', 'active', 'retrying') OR (o.state = 'dead' AND o.hold_key_when_dead))
          AND NOT (n.state IN ('scheduled', 'available', 'active', 'retrying') OR (n.state = 'dead' AND n.hold_key_when_dead)))
     ORDER BY k.queue, k.key
       FOR UPDATE OF k) AS locked;
  IF locked_count < released_count THEN
    -- ...and made again where pruning removed one.
    INSERT INTO ordering_keys AS k (queue, key)
    SELECT DISTINCT n.queue, n.ordering_key
      FROM released_new AS n JOIN released_old AS o ON o.id = n.id
     WHERE n.ordering_key IS NOT NULL
       AND (o.state IN ('scheduled', 'available', 'active', 'retrying') OR (o.state = 'dead' AND o.hold_key_when_dead))
       AND NOT (n.state IN ('scheduled', 'available', 'active', 'retrying') OR (n.state = 'dead' AND n.hold_key_when_dead))
     ORDER BY 1, 2
    ON CONFLICT (queue, key) DO UPDATE SET touched_at = now();
  END IF;
  -- With the locks held, this statement's snapshot sees every committed job of those keys: the
  -- next job of each key that no other job holds is unblocked, and its queue woken once.
  FOR woken IN
    WITH released AS (
      SELECT DISTINCT n.queue, n.ordering_key AS key
        FROM released_new AS n JOIN released_old AS o ON o.id = n.id
       WHERE n.ordering_key IS NOT NULL
         AND (o.state IN ('scheduled', 'available', 'active', 'retrying') OR (o.state = 'dead' AND o.hold_key_when_dead))
         AND NOT (n.state IN ('scheduled', 'available', 'active', 'retrying') OR (n.state = 'dead' AND n.hold_key_when_dead))),
    next AS (
      SELECT (SELECT j.id FROM jobs AS j
               WHERE j.queue = r.queue AND j.ordering_key = r.key AND j.blocked
                 AND j.state IN ('scheduled', 'available', 'retrying')
               ORDER BY j.ordering_seq LIMIT 1) AS id
        FROM released AS r
       WHERE NOT EXISTS (
         SELECT 1 FROM jobs AS h
          WHERE h.queue = r.queue AND h.ordering_key = r.key AND NOT h.blocked
            AND (h.state IN ('scheduled', 'available', 'active', 'retrying') OR (h.state = 'dead' AND h.hold_key_when_dead)))),
    unblocked AS (
      UPDATE jobs AS j SET blocked = false FROM next WHERE j.id = next.id RETURNING j.queue)
    SELECT DISTINCT queue FROM unblocked
  LOOP
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_wakeup', woken);
  END LOOP;
  RETURN NULL;
END;
$$;

-- Transition tables need a trigger on every UPDATE (no column list); the function returns at
-- once when no row let go of a key.
CREATE TRIGGER jobs_ordering_release AFTER UPDATE ON :"schema".jobs
  REFERENCING OLD TABLE AS released_old NEW TABLE AS released_new
  FOR EACH STATEMENT EXECUTE FUNCTION :"schema".ordering_release();

INSERT INTO :"schema".migrations (version, name) VALUES (11, 'ordering_release_per_statement');
