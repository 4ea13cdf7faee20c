-- mailroom migration 8: the dead-letter queue as a work surface (docs/DEAD-LETTERS.md).
-- Every replay or discard of dead letters (dry runs too) is one row of dead_letter_replays: when,
-- which filter, how many matched and were acted on, by whom, and whether it was interrupted. Every
-- job it acted on gets one row of dead_letter_replay_jobs, so a job's history shows each time it was
-- replayed (or discarded), when, by whom, and when and why it had died before.

CREATE TABLE :"schema".dead_letter_replays (
  id uuid PRIMARY KEY,
  action text NOT NULL CHECK (action IN ('replay', 'discard')),
  started_at timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz,
  filter jsonb NOT NULL,
  matched integer NOT NULL DEFAULT 0,
  replayed integer NOT NULL DEFAULT 0,
  dry_run boolean NOT NULL DEFAULT false,
  by text,
  interrupted boolean NOT NULL DEFAULT false
);
COMMENT ON COLUMN :"schema".dead_letter_replays.replayed IS 'jobs acted on: replayed, or discarded when action = discard; grows with each committed batch';
COMMENT ON COLUMN :"schema".dead_letter_replays.finished_at IS 'NULL while running, or when the process died mid-way (the jobs counted in replayed were acted on)';

-- Deleted with its job (retention of dead and finished jobs); the primary key serves the history look-up.
CREATE TABLE :"schema".dead_letter_replay_jobs (
  job_id uuid NOT NULL REFERENCES :"schema".jobs (id) ON DELETE CASCADE,
  replay_id uuid NOT NULL REFERENCES :"schema".dead_letter_replays (id),
  at timestamptz NOT NULL DEFAULT now(),
  died_at timestamptz,
  dead_reason text,
  attempt integer NOT NULL,
  PRIMARY KEY (job_id, replay_id)
);

INSERT INTO :"schema".migrations (version, name) VALUES (8, 'dead_letter_replays');
