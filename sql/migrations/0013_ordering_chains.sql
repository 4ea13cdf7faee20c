-- mailroom migration 13: a worker may claim a few jobs of a key behind its head (a chain).
-- (Migrations 1, 6 and 11 have the rest of per-key ordering; see docs/ORDERING.md.)
--
-- A key used to move on by one job per completion-then-claim cycle: the completion unblocked the
-- next job (an update of a wide row) and a claim had to find it. Now the claim also takes the next
-- jobs of each head's key that are waiting and due, as *followers*: active, leased to the worker,
-- and still `blocked`. The worker runs a follower only after the job before it was completed
-- (committed), so handlers of a key still run one at a time in enqueue order, also across a crash.
--
-- So an active job holds its key whether it is blocked or not. A follower handed back unstarted
-- (the job before it failed, the worker stopped, its lease expired) is waiting and blocked again:
-- it no longer holds the key, and the release below gives the key to the next job as for any job
-- that lets go of it (to the follower itself when no job before it holds the key any more).

DROP INDEX :"schema".jobs_ordering_holder_idx;
CREATE INDEX jobs_ordering_holder_idx ON :"schema".jobs (queue, ordering_key)
  WHERE ordering_key IS NOT NULL AND (state = 'active' OR NOT blocked)
    AND (state IN ('scheduled', 'available', 'active', 'retrying') OR (state = 'dead' AND hold_key_when_dead));

CREATE OR REPLACE FUNCTION :"schema".ordering_release() RETURNS trigger LANGUAGE plpgsql
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
  -- The keys this statement's rows let go of are those of rows with a key that hold it no more:
  -- finished, dead without hold_key_when_dead, or a claimed follower handed back unstarted (waiting
  -- and blocked again). A row that did not hold it before either (a dead job discarded, a blocked
  -- job rescheduled) is counted too: its key is looked at for nothing, which changes nothing.
  IF NOT EXISTS (SELECT 1 FROM released_new AS n WHERE n.ordering_key IS NOT NULL AND NOT ((n.state = 'active' OR NOT n.blocked) AND (n.state IN ('scheduled', 'available', 'active', 'retrying') OR (n.state = 'dead' AND n.hold_key_when_dead)))) THEN
    RETURN NULL; -- claims, heartbeats, jobs without keys
  END IF;
  -- Their rows, locked in key order (two statements cannot lock them crosswise), and made again
  -- where pruning removed one.
  FOR key_queue, key_name IN
    SELECT DISTINCT n.queue, n.ordering_key FROM released_new AS n
     WHERE n.ordering_key IS NOT NULL AND NOT ((n.state = 'active' OR NOT n.blocked) AND (n.state IN ('scheduled', 'available', 'active', 'retrying') OR (n.state = 'dead' AND n.hold_key_when_dead)))
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
                    WHERE h.queue = r.queue AND h.ordering_key = r.key AND (h.state = 'active' OR NOT h.blocked)
                      AND (h.state IN ('scheduled', 'available', 'active', 'retrying') OR (h.state = 'dead' AND h.hold_key_when_dead))) AS held
      FROM (SELECT DISTINCT n.queue, n.ordering_key AS key FROM released_new AS n
             WHERE n.ordering_key IS NOT NULL AND NOT ((n.state = 'active' OR NOT n.blocked) AND (n.state IN ('scheduled', 'available', 'active', 'retrying') OR (n.state = 'dead' AND n.hold_key_when_dead)))) AS r) AS k
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

INSERT INTO :"schema".migrations (version, name) VALUES (13, 'ordering_chains');
