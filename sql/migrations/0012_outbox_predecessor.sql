-- mailroom migration 12: each keyed outbox row names the row of its key before it.
-- (Migration 5 has the outbox, the key lock and the relay's read; see docs/EVENTS.md.)
--
-- The relay reads in (xid, position) order, but per-key order is position order, and the two
-- differ when a transaction took its xid before another and its key after the other committed.
-- Until now the relay found such rows by walking every key of a batch down its rows, one index
-- probe per row read: about half of the database's time in a relay's read. Now the publish
-- records the key's previous row while it holds the key lock (it is then the key's last row, and
-- nothing can come between), so the relay sees from each row alone whether it must wait for a row
-- further on, and reads a batch in one statement.
--
-- The previous row is only known for certain when the look-up sees every committed row, that is
-- under READ COMMITTED (each statement takes a fresh snapshot, here after the key lock). Under
-- REPEATABLE READ or SERIALIZABLE the snapshot may be older than the key's last commit, so the
-- columns stay NULL: unknown, and the relay walks that key as before. Rows written before this
-- migration are NULL too. prev_position 0 (prev_xid 0) means the key had no row before.

ALTER TABLE :"schema".outbox ADD COLUMN prev_position bigint, ADD COLUMN prev_xid xid8;
COMMENT ON COLUMN :"schema".outbox.prev_position IS 'the same key''s previous row (0: none; NULL: unknown, or no key), recorded under the key lock';
COMMENT ON COLUMN :"schema".outbox.prev_xid IS 'that row''s xid (0 with prev_position 0; NULL when unknown)';

-- The look-up is planned once per session and kept: with sequential scans off it stays the probe
-- of outbox_subject_idx at the key's last position, however small the table was when planned.
CREATE OR REPLACE FUNCTION :"schema".outbox_before_insert() RETURNS trigger LANGUAGE plpgsql
  SET search_path = :"schema"
  SET enable_seqscan = off
  AS $$
BEGIN
  NEW.prev_position := NULL;
  NEW.prev_xid := NULL;
  IF NEW.subject IS NOT NULL THEN
    INSERT INTO outbox_keys AS k (key) VALUES (NEW.subject)
      ON CONFLICT (key) DO UPDATE SET touched_at = now() WHERE k.touched_at < now() - interval '10 minutes';
    IF current_setting('transaction_isolation') = 'read committed' THEN
      SELECT o.position, o.xid INTO NEW.prev_position, NEW.prev_xid
        FROM outbox AS o WHERE o.subject = NEW.subject ORDER BY o.position DESC LIMIT 1;
      IF NOT FOUND THEN
        NEW.prev_position := 0;
        NEW.prev_xid := '0';
      END IF;
    END IF;
  END IF;
  NEW.position := nextval('outbox_position_seq');
  RETURN NEW;
END;
$$;

INSERT INTO :"schema".migrations (version, name) VALUES (12, 'outbox_predecessor');
