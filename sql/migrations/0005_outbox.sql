-- mailroom migration 5: the transactional outbox, the relay's cursors, consumer groups and the inbox.
--
-- outbox: one row per published event, written in the publisher's transaction. `xid` is the
-- writing transaction's id: the relay reads past its cursor only below
-- pg_snapshot_xmin(pg_current_snapshot()), so a transaction that commits late is never skipped
-- (position order is not commit order). A keyed event first takes its key's row lock in
-- outbox_keys (held to commit), and only then its position: for one key, position order is the
-- order in which transactions took the key, which is their commit order.

CREATE TABLE :"schema".outbox (
  position bigint PRIMARY KEY,
  xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
  id uuid NOT NULL UNIQUE,
  type text NOT NULL,
  version integer NOT NULL CHECK (version >= 1),
  source text NOT NULL,
  subject text,
  time timestamptz NOT NULL,
  correlation_id text,
  causation_id text,
  traceparent text,
  headers jsonb,
  data jsonb NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON COLUMN :"schema".outbox.position IS 'taken after the key lock (trigger outbox_before_insert): per key, the commit order';
COMMENT ON COLUMN :"schema".outbox.xid IS 'the publishing transaction: the relay reads only rows below the oldest running transaction';

CREATE SEQUENCE :"schema".outbox_position_seq OWNED BY :"schema".outbox.position;

-- The relay's read order: (xid, position) past its cursor.
CREATE INDEX outbox_relay_idx ON :"schema".outbox (xid, position);
-- Same-key predecessors of a batch (the relay keeps per-key order).
CREATE INDEX outbox_subject_idx ON :"schema".outbox (subject, position) WHERE subject IS NOT NULL;
-- Retention.
CREATE INDEX outbox_created_idx ON :"schema".outbox (created_at);

-- One row per key, locked by every keyed publish until its transaction ends. The row is
-- rewritten only when it is older than 10 minutes (ON CONFLICT DO UPDATE locks the row even
-- when its WHERE is false), so a hot key does not bloat. Idle rows are pruned by the relay.
CREATE TABLE :"schema".outbox_keys (
  key text PRIMARY KEY,
  touched_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION :"schema".outbox_before_insert() RETURNS trigger LANGUAGE plpgsql
  SET search_path = :"schema" AS $$
BEGIN
  IF NEW.subject IS NOT NULL THEN
    INSERT INTO outbox_keys AS k (key) VALUES (NEW.subject)
      ON CONFLICT (key) DO UPDATE SET touched_at = now() WHERE k.touched_at < now() - interval '10 minutes';
  END IF;
  NEW.position := nextval('outbox_position_seq');
  RETURN NEW;
END;
$$;

CREATE TRIGGER outbox_position BEFORE INSERT ON :"schema".outbox
  FOR EACH ROW EXECUTE FUNCTION :"schema".outbox_before_insert();

-- Wake relays once per statement (a hint only: relays also poll). Delivered at commit.
CREATE FUNCTION :"schema".notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify(TG_TABLE_SCHEMA || '_outbox', '');
  RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_notify AFTER INSERT ON :"schema".outbox
  FOR EACH STATEMENT EXECUTE FUNCTION :"schema".notify_outbox();

-- One row per relay target: how far it has delivered, in (xid, position) order, and who holds
-- it. `token` is the fencing token: incremented by every takeover; every write of a holder
-- checks it, so a relay that lost its lease can never move the cursor.
CREATE TABLE :"schema".relay_cursors (
  target text PRIMARY KEY,
  cursor_xid xid8 NOT NULL DEFAULT '0',
  cursor_position bigint NOT NULL DEFAULT 0,
  holder text,
  token bigint NOT NULL DEFAULT 0,
  locked_until timestamptz,
  delivered bigint NOT NULL DEFAULT 0,
  delivered_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- Internal subscribers. The relay's internal target turns each event into one job per group
-- whose `types` include it, in the group's `queue`. `start_snapshot` (from: 'now') is the
-- snapshot taken when the group was created: events visible in it (committed before) are not
-- delivered to the group; NULL (from: 'earliest') takes every retained event.
CREATE TABLE :"schema".consumer_groups (
  name text PRIMARY KEY,
  queue text NOT NULL,
  types text[] NOT NULL,
  start_snapshot pg_snapshot,
  max_attempts integer NOT NULL CHECK (max_attempts >= 1),
  max_age_ms bigint,
  inbox_retention_ms bigint NOT NULL,
  duplicates_rejected bigint NOT NULL DEFAULT 0,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- Events a group has handled: written in the handler's transaction (ctx.tx), with the work and
-- the job's completion. A redelivered event finds its key and is not handled again.
CREATE TABLE :"schema".inbox (
  consumer_group text NOT NULL,
  event_id uuid NOT NULL,
  received_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer_group, event_id)
);

CREATE INDEX inbox_received_idx ON :"schema".inbox (consumer_group, received_at);

INSERT INTO :"schema".migrations (version, name) VALUES (5, 'outbox');
