-- mailroom migration 7: consumer groups that read from a broker.
-- A group with a source (rabbitmq, nats, redis, …) gets its events from the broker, stored as jobs
-- of its queue when they arrive; the internal fan-out leaves it alone, so an event published here
-- and also consumed from a broker is not delivered to the group twice.

ALTER TABLE :"schema".consumer_groups ADD COLUMN source text;
COMMENT ON COLUMN :"schema".consumer_groups.source IS 'NULL: internal events through the relay; otherwise the broker it reads from (e.g. rabbitmq queue billing)';

INSERT INTO :"schema".migrations (version, name) VALUES (7, 'broker_sources');
