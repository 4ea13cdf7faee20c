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
  key_queues text[];
  key_names text[];
  locked int;
  next_ids uuid[];
  woken text;
BEGIN
  -- The keys this statement's rows let go of are those of rows with a key that hold it no more:
  -- finished, dead without hold_key_when_dead, or a claimed follower handed back unstarted (waiting
  -- and blocked again). A row that did not hold it before either (a dead job discarded, a blocked
  -- job rescheduled) is counted too: its key is looked at for nothing, which changes nothing.
  SELECT array_agg(d.queue ORDER BY d.queue, d.key), array_agg(d.key ORDER BY d.queue, d.key)
    INTO key_queues, key_names
    FROM (SELECT DISTINCT n.queue, n.ordering_key AS key FROM released_new AS n WHERE n.ordering_key IS NOT NULL AND NOT ((n.state = 'active' OR NOT n.blocked) AND (n.state IN ('scheduled', 'available', 'active', 'retrying') OR (n.state = 'dead' AND n.hold_key_when_dead)))) AS d;
  IF key_queues IS NULL THEN
    RETURN NULL; -- claims, heartbeats, jobs without keys
  END IF;
  -- Their rows, locked in key order in one statement (two statements cannot lock them crosswise)...
  SELECT count(*) INTO locked FROM (
    SELECT 1 FROM ordering_keys AS o
      JOIN unnest(key_queues, key_names) AS u(queue, key) ON o.queue = u.queue AND o.key = u.key
     ORDER BY o.queue, o.key
     FOR UPDATE OF o) AS l;
  -- ...and made again, in key order, where pruning removed one (a row already locked is taken again at once).
  IF locked < cardinality(key_queues) THEN
    FOR i IN 1 .. cardinality(key_queues) LOOP
      INSERT INTO ordering_keys (queue, key) VALUES (key_queues[i], key_names[i])
        ON CONFLICT (queue, key) DO UPDATE SET touched_at = now();
    END LOOP;
  END IF;
  -- With the locks held, this statement's snapshot sees every committed job of those keys: of the
  -- keys no job holds any more (most keys a worker's chain goes on with are still held by its next
  -- job, and cost this one probe), the next job...
  -- (The holder probe is a scalar subquery, not NOT EXISTS, which PostgreSQL may turn into a join
  -- that reads every holder when it planned on a nearly empty table.)
  WITH free AS MATERIALIZED (
    SELECT u.queue, u.key FROM unnest(key_queues, key_names) AS u(queue, key)
     WHERE (SELECT h.id FROM jobs AS h
             WHERE h.queue = u.queue AND h.ordering_key = u.key AND (h.state = 'active' OR NOT h.blocked)
               AND (h.state IN ('scheduled', 'available', 'active', 'retrying') OR (h.state = 'dead' AND h.hold_key_when_dead))
             LIMIT 1) IS NULL)
  SELECT array_agg(nx.id) INTO next_ids
    FROM free AS f
    CROSS JOIN LATERAL (SELECT j.id FROM jobs AS j
                         WHERE j.queue = f.queue AND j.ordering_key = f.key AND j.blocked
                           AND j.state IN ('scheduled', 'available', 'retrying')
                         ORDER BY j.ordering_seq LIMIT 1) AS nx;
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
