-- mailroom migration 2: results of ctx.step(), so a retried job does not repeat a finished side effect.

CREATE TABLE :"schema".job_steps (
  job_id uuid NOT NULL REFERENCES :"schema".jobs (id) ON DELETE CASCADE,
  name text NOT NULL,
  result jsonb,
  attempt integer NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (job_id, name)
);

INSERT INTO :"schema".migrations (version, name) VALUES (2, 'job_steps');
