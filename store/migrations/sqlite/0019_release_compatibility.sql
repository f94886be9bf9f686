-- Rolling upgrades (core/releases.py): see the PostgreSQL migration 0021.
CREATE TABLE schema_contractions (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    oldest_release TEXT NOT NULL
);
ALTER TABLE replicas ADD COLUMN oldest_peer TEXT;
