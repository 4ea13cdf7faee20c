-- mailroom migration 3: the newest version applied per entity, for ctx.isNewer() / mailroom.versions.

CREATE TABLE :"schema".entity_versions (
  entity text PRIMARY KEY,
  version bigint NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO :"schema".migrations (version, name) VALUES (3, 'entity_versions');
