-- mailroom migration 10: the W3C trace context of each job.
-- A job enqueued inside a traced request, or made from an event that carried a `traceparent`
-- (a consumer group's job), keeps it here, so the worker's span of the handler joins the same
-- trace, in whatever process it runs. NULL when there was no trace. Adding a nullable column
-- without a default changes no existing row.

ALTER TABLE :"schema".jobs ADD COLUMN traceparent text;
COMMENT ON COLUMN :"schema".jobs.traceparent IS 'W3C traceparent of the span that enqueued the job (or of the event it was made from); NULL without tracing';

INSERT INTO :"schema".migrations (version, name) VALUES (10, 'job_traceparent');
