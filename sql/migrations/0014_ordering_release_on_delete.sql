-- mailroom migration 14: deleting a job that holds its ordering key hands the key on.
-- (Migrations 1, 6, 11 and 13 have the rest of per-key ordering; see docs/ORDERING.md.)
--
-- Until now only an UPDATE let a key go. A dead job kept with `ordering.onDead = 'hold'` holds its
-- key, and when dead-letter retention deleted it, nothing held the key any more, yet the job
-- waiting behind it stayed blocked until something wrote to it. A statement trigger on DELETE now
-- hands on the keys of the deleted rows that held theirs, as the release does for an UPDATE.
--
-- The part both triggers share (lock the keys, find the keys no job holds, unblock each one's next
-- job) moves into ordering_hand_on; ordering_release keeps its look at the updated rows and calls
-- it, so the release of an UPDATE does what it did before.

-- Its only arguments are the keys: a collatable argument of another collation (TG_TABLE_SCHEMA is a
-- name, collation "C") would give the call no common collation, and the key comparisons below could
-- then not use the indexes (one full index scan per key, found by test/ordering.test.ts' plan test).
CREATE FUNCTION :"schema".ordering_hand_on(key_queues text[], key_names text[]) RETURNS void LANGUAGE plpgsql
  SET search_path = :"schema"
  SET enable_seqscan = off
  SET enable_hashjoin = off
  SET enable_mergejoin = off
  AS $$
DECLARE
  locked int;
  next_ids uuid[];
  woken text;
BEGIN
  -- The keys' rows (key_queues, key_names: sorted by queue, then key), locked in that order in one
  -- statement (two statements cannot lock them crosswise)...
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
    RETURN;
  END IF;
  -- ...is unblocked (unless it was cancelled meanwhile), and its queue woken once.
  FOR woken IN
    WITH unblocked AS (
      UPDATE jobs SET blocked = false
       WHERE id = ANY (next_ids) AND blocked AND state IN ('scheduled', 'available', 'retrying')
      RETURNING queue)
    SELECT DISTINCT queue FROM unblocked
  LOOP
    PERFORM pg_notify(current_schema() || '_wakeup', woken); -- the schema of search_path above, the jobs table's
  END LOOP;
END;
$$;

-- The release of an UPDATE: the keys of rows that hold theirs no more (migration 13), handed on.
CREATE OR REPLACE FUNCTION :"schema".ordering_release() RETURNS trigger LANGUAGE plpgsql
  SET search_path = :"schema"
  AS $$
DECLARE
  key_queues text[];
  key_names text[];
BEGIN
  -- The keys this statement's rows let go of are those of rows with a key that hold it no more:
  -- finished, dead without hold_key_when_dead, or a claimed follower handed back unstarted (waiting
  -- and blocked again). A row that did not hold it before either (a dead job discarded, a blocked
  -- job rescheduled) is counted too: its key is looked at for nothing, which changes nothing.
  SELECT array_agg(d.queue ORDER BY d.queue, d.key), array_agg(d.key ORDER BY d.queue, d.key)
    INTO key_queues, key_names
    FROM (SELECT DISTINCT n.queue, n.ordering_key AS key FROM released_new AS n WHERE n.ordering_key IS NOT NULL AND NOT ((n.state = 'active' OR NOT n.blocked) AND (n.state IN ('scheduled', 'available', 'active', 'retrying') OR (n.state = 'dead' AND n.hold_key_when_dead)))) AS d;
  IF key_queues IS NOT NULL THEN
    PERFORM ordering_hand_on(key_queues, key_names);
  END IF;
  RETURN NULL; -- claims, heartbeats, jobs without keys: nothing to hand on
END;
$$;

-- The release of a DELETE: the keys of deleted rows that held theirs (a dead job kept with
-- hold_key_when_dead that retention deletes; any holder deleted by hand).
CREATE FUNCTION :"schema".ordering_release_deleted() RETURNS trigger LANGUAGE plpgsql
  SET search_path = :"schema"
  AS $$
DECLARE
  key_queues text[];
  key_names text[];
BEGIN
  SELECT array_agg(d.queue ORDER BY d.queue, d.key), array_agg(d.key ORDER BY d.queue, d.key)
    INTO key_queues, key_names
    FROM (SELECT DISTINCT o.queue, o.ordering_key AS key FROM released_old AS o WHERE o.ordering_key IS NOT NULL AND (o.state = 'active' OR NOT o.blocked) AND (o.state IN ('scheduled', 'available', 'active', 'retrying') OR (o.state = 'dead' AND o.hold_key_when_dead))) AS d;
  IF key_queues IS NOT NULL THEN
    PERFORM ordering_hand_on(key_queues, key_names);
  END IF;
  RETURN NULL; -- completed, cancelled and discarded jobs held nothing
END;
$$;

CREATE TRIGGER jobs_ordering_release_deleted AFTER DELETE ON :"schema".jobs
  REFERENCING OLD TABLE AS released_old
  FOR EACH STATEMENT EXECUTE FUNCTION :"schema".ordering_release_deleted();

INSERT INTO :"schema".migrations (version, name) VALUES (14, 'ordering_release_on_delete');
