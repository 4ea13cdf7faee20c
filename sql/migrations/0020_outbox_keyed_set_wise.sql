-- mailroom migration 20: a publish with keys locks them and records each row's previous row set-wise.
--
-- The outbox trigger did, for every keyed row, an upsert of the key's row in outbox_keys (the
-- key's lock), a probe for the key's last row and a nextval: two statements of a PL/pgSQL function
-- with two SET clauses, per row. A keyed publishMany ran at about a third of an unkeyed one.
-- outbox_publish_keyed does the same work for a whole batch in two statements, one round trip:
--   1. it locks every key of the batch (their outbox_keys rows, sorted, held until the transaction
--      ends);
--   2. in a statement of its own, so that under READ COMMITTED its snapshot sees every row of those
--      keys committed before the locks were granted, it inserts the rows with their positions
--      (nextval in the batch's order, after the locks) and their previous rows: the row before
--      in the batch for a key's second and later rows, else the key's last stored row (0 if none),
--      probed through outbox_subject_idx.
-- Under REPEATABLE READ or SERIALIZABLE the previous rows stay NULL (unknown), as the trigger left
-- them (migration 12). $12 is the xid the caller's transaction had: in autocommit (a transaction
-- that already ended) it differs, nothing is written and the publish refuses. The trigger keeps
-- every other insert (one without a position) as it was.

CREATE FUNCTION :"schema".outbox_publish_keyed(
  ids uuid[], event_type text, event_version integer, event_source text, event_time timestamptz,
  correlation text, causation text, trace text, event_headers jsonb, keys text[], payloads text[],
  expected_xid xid8
) RETURNS SETOF uuid LANGUAGE plpgsql
  SET search_path = :"schema"
  -- The probe of a key's last row stays an index scan however small the outbox was when planned.
  SET enable_seqscan = off
  SET plan_cache_mode = force_generic_plan
  AS $$
DECLARE
  read_committed boolean := current_setting('transaction_isolation') = 'read committed';
BEGIN
  IF expected_xid IS NOT NULL AND pg_current_xact_id() <> expected_xid THEN
    RETURN;
  END IF;
  INSERT INTO outbox_keys AS k (key)
    SELECT DISTINCT u.key FROM unnest(keys) AS u(key) WHERE u.key IS NOT NULL ORDER BY 1
    ON CONFLICT (key) DO UPDATE SET touched_at = now() WHERE k.touched_at < now() - interval '10 minutes';
  RETURN QUERY
  WITH inserted AS (
    INSERT INTO outbox AS o (position, id, type, version, source, subject, time, correlation_id, causation_id, traceparent, headers, data, prev_position, prev_xid)
    SELECT c.position, c.id, event_type, event_version, event_source, c.subject, event_time, correlation, causation, trace, event_headers, c.data::jsonb,
           CASE WHEN c.subject IS NULL OR NOT read_committed THEN NULL
                WHEN c.prev_in_batch IS NOT NULL THEN c.prev_in_batch
                ELSE coalesce(last.position, 0) END,
           CASE WHEN c.subject IS NULL OR NOT read_committed THEN NULL
                WHEN c.prev_in_batch IS NOT NULL THEN pg_current_xact_id()
                ELSE coalesce(last.xid, '0'::xid8) END
      FROM (SELECT p.*, lag(p.position) OVER (PARTITION BY p.subject ORDER BY p.ord) AS prev_in_batch
              FROM (SELECT u.id, u.subject, u.data, u.ord, nextval('outbox_position_seq') AS position
                      FROM unnest(ids, keys, payloads) WITH ORDINALITY AS u(id, subject, data, ord)
                     ORDER BY u.ord OFFSET 0) AS p) AS c
      LEFT JOIN LATERAL (SELECT s.position, s.xid FROM outbox AS s
                          WHERE c.subject IS NOT NULL AND c.prev_in_batch IS NULL AND read_committed AND s.subject = c.subject
                          ORDER BY s.position DESC LIMIT 1) AS last ON true
     ORDER BY c.ord
    RETURNING o.id
  )
  SELECT inserted.id FROM inserted;
END;
$$;

INSERT INTO :"schema".migrations (version, name) VALUES (20, 'outbox_keyed_set_wise');
