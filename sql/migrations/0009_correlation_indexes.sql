-- mailroom migration 9: follow one request through the outbox.
-- `mailroom.jobs.byCorrelation(id)` and `mailroom jobs get --correlation ID` look up every job and
-- every outbox event of one correlation id. Jobs have had a partial index on correlation_id since
-- migration 1 (jobs_correlation_idx); this adds the outbox's, partial like it: most events carry no
-- correlation id, and those take no room in the index. The outbox is kept small by the relay's
-- retention, so building the index takes a short lock.

CREATE INDEX outbox_correlation_idx ON :"schema".outbox (correlation_id) WHERE correlation_id IS NOT NULL;

INSERT INTO :"schema".migrations (version, name) VALUES (9, 'correlation_indexes');
