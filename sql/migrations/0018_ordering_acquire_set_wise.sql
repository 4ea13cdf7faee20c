-- mailroom migration 18: an insert may take its keyed rows' ordering work on itself, set-wise.
--
-- The acquire trigger did, for every keyed row, an upsert of the key's row in ordering_keys (the
-- key's lock) and a probe for another job of the key, two statements of a PL/pgSQL function per
-- row: of a fan-out of 2,000 events with a key each, 195 ms of which 50 were the insert itself.
-- An insert that names the ordering_seq of its keyed rows now does that work itself: in a
-- statement of its own before the insert it locked the keys of its rows (upserted their
-- ordering_keys rows, sorted by queue and key, as the release locks them), so that the insert's
-- snapshot sees every job committed before the locks were granted; it then computes `blocked`
-- for all its rows at once (behind an unfinished job of the key, or behind an earlier row of the
-- key in the same insert). The trigger still runs for every keyed row inserted without a seq, so
-- every other insert keeps its guarantee as it was. See docs/ORDERING.md.
DROP TRIGGER jobs_ordering_acquire ON :"schema".jobs;
CREATE TRIGGER jobs_ordering_acquire BEFORE INSERT ON :"schema".jobs
  FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL AND NEW.ordering_seq IS NULL)
  EXECUTE FUNCTION :"schema".ordering_acquire();

INSERT INTO :"schema".migrations (version, name) VALUES (18, 'ordering_acquire_set_wise');
