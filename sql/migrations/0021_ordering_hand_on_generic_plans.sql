-- mailroom migration 21: the release plans its statements once per session, not on every call.
--
-- ordering_hand_on (migration 13) takes the keys a statement released as two arrays. PL/pgSQL
-- prepares its statements with those arrays as parameters, and PostgreSQL compared each call's
-- custom plan (which knows how many keys there are) with the generic one (which assumes ten): the
-- custom plan always looked cheaper, so all three statements were planned again on every call.
-- Measured on a 2-core machine: 1.7-2.5 ms a call for one key, 0.6-0.7 ms with the generic plans;
-- one key's jobs drained at 235-302 jobs/s before, 367-468 after (docs/BENCHMARKS.md, session 43).
-- The generic plans are made once per session and are the same index probes whatever the table's
-- size when they were made (enable_seqscan, enable_hashjoin and enable_mergejoin are off in the
-- function, as before).
ALTER FUNCTION :"schema".ordering_hand_on(text[], text[]) SET plan_cache_mode = force_generic_plan;

INSERT INTO :"schema".migrations (version, name) VALUES (21, 'ordering_hand_on_generic_plans');
