-- mailroom migration 11: a key is let go of once per statement, not once per row.
-- (Migrations 1 and 6 have the rest of per-key ordering; see docs/ORDERING.md.)
--
-- The release used to be a row trigger: for every job that let go of its key it ran three
-- statements of its own (lock the key row, look for another holder, unblock the next job). A
-- worker's batched completion of 500 ordered jobs spent 2-4 times as long in that trigger as in
-- the completion itself. Now one statement trigger sees the statement's changed rows (transition
-- table), finds the keys let go of, locks their rows in key order (a cheap statement per key),
-- and then, in a statement of its own (a fresh snapshot, taken with the locks held, so it sees
-- every committed job of those keys), finds the next job of each key that no other job holds,
-- and unblocks them all in one more.
--
-- A statement that lets go of no key (claims, heartbeats, jobs without keys) pays for one pass over
-- its changed rows. The key row is now locked, not updated, when a key is let go of: `touched_at`
-- says when a job last took the key, which is what pruning asks.

DROP TRIGGER jobs_ordering_release ON :"schema".jobs;
DROP FUNCTION :"schema".ordering_release();

-- Its statements are planned once per session and the plans kept, so they must not depend on how
-- big the tables were then: planned on a fresh, nearly empty schema, PostgreSQL chose to read every
-- holder of every key for each key let go of, and kept that plan as the table grew. So each look-up
-- here is written per key (a parameter, not a join), and sequential scans, hash and merge joins are
-- off in this function: whatever the sizes, it is an index probe per key let go of.
CREATE FUNCTION :"schema".ordering_release() RETURNS trigger LANGUAGE plpgsql
  SET search_path = :"schema"
  SET enable_seqscan = off
  SET enable_hashjoin = off
  SET enable_mergejoin = off
  AS $$
DECLARE
  key_queue text;
  key_name text;
  next_ids uuid[];
  woken text;
BEGIN
  -- The keys this statement's rows let go of are those of rows with a key that hold it no more
  -- (finished, or dead without hold_key_when_dead). A row that did not hold it before either (a
  -- dead job discarded) is counted too: its key is looked at for nothing, which changes nothing.
  IF NOT EXISTS (SELECT 1 FROM released_new AS n WHERE n.ordering_key IS NOT NULL AND NOT (n.state IN ('scheduled', 'available', 'active', 'retrying') OR (n.state = 'dead' AND n.hold_key_when_dead))) THEN
    RETURN NULL; -- claims, heartbeats, jobs without keys
  END IF;
  -- Their rows, locked in key order (two statements cannot lock them crosswise), and made again
  -- where pruning removed one.
  FOR key_queue, key_name IN
    SELECT DISTINCT n.queue, n.ordering_key FROM released_new AS n
     WHERE n.ordering_key IS NOT NULL AND NOT (n.state IN ('scheduled', 'available', 'active', 'retrying') OR (n.state = 'dead' AND n.hold_key_when_dead))
     ORDER BY 1, 2
  LOOP
    PERFORM 1 FROM ordering_keys WHERE queue = key_queue AND key = key_name FOR UPDATE;
    IF NOT FOUND THEN
      INSERT INTO ordering_keys (queue, key) VALUES (key_queue, key_name)
        ON CONFLICT (queue, key) DO UPDATE SET touched_at = now();
    END IF;
  END LOOP;
  -- With the locks held, this statement's snapshot sees every committed job of those keys: the
  -- next job of each key that no other job holds...
  SELECT array_agg(k.next_id) INTO next_ids FROM (
    SELECT (SELECT j.id FROM jobs AS j
             WHERE j.queue = r.queue AND j.ordering_key = r.key AND j.blocked
               AND j.state IN ('scheduled', 'available', 'retrying')
             ORDER BY j.ordering_seq LIMIT 1) AS next_id,
           EXISTS (SELECT 1 FROM jobs AS h
                    WHERE h.queue = r.queue AND h.ordering_key = r.key AND NOT h.blocked
                      AND (h.state IN ('scheduled', 'available', 'active', 'retrying') OR (h.state = 'dead' AND h.hold_key_when_dead))) AS held
      FROM (SELECT DISTINCT n.queue, n.ordering_key AS key FROM released_new AS n
             WHERE n.ordering_key IS NOT NULL AND NOT (n.state IN ('scheduled', 'available', 'active', 'retrying') OR (n.state = 'dead' AND n.hold_key_when_dead))) AS r) AS k
   WHERE k.next_id IS NOT NULL AND NOT k.held;
  IF next_ids IS NULL THEN
    RETURN NULL;
  END IF;
  -- ...is unblocked (unless it was cancelled meanwhile), and its queue woken once.
  FOR woken IN
    WITH unblocked AS (
      UPDATE jobs SET blocked = false
       WHERE id = ANY (next_ids) AND blocked AND state IN ('scheduled', 'available', 'retrying')
      RETURNING queue)
    SELECT DISTINCT queue FROM unblocked
  LOOP
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_wakeup', woken);
  END LOOP;
  RETURN NULL;
END;
$$;

-- A transition table needs a trigger on every UPDATE (no column list); the function returns at
-- once when no row let go of a key.
CREATE TRIGGER jobs_ordering_release AFTER UPDATE ON :"schema".jobs
  REFERENCING NEW TABLE AS released_new
  FOR EACH STATEMENT EXECUTE FUNCTION :"schema".ordering_release();

INSERT INTO :"schema".migrations (version, name) VALUES (11, 'ordering_release_per_statement');
