-- mailroom migration 15: events a relay target refused for good are parked, not retried forever.
--
-- A target says an event can never be delivered as it is (larger than the broker accepts, say) by
-- throwing RefusedEventError. With the relay's default (`onRefused: 'park'`) the event is recorded
-- here, with the envelope as it was sent and the target's reason, the target's cursor moves past
-- it, and the events after it are delivered. The row stays until an operator deletes it (the outbox
-- row may be pruned meanwhile; `body` keeps what was refused). See docs/EVENTS.md.
CREATE TABLE :"schema".relay_parked (
  target text NOT NULL,
  position bigint NOT NULL,
  xid xid8 NOT NULL,
  event_id text NOT NULL,
  type text NOT NULL,
  reason text NOT NULL,
  body text NOT NULL,
  holder text NOT NULL,
  parked_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (target, position)
);

INSERT INTO :"schema".migrations (version, name) VALUES (15, 'relay_parked');
