-- Rolling upgrades (core/releases.py): which releases may share this store.
-- * schema_contractions: one row per applied migration that declared the oldest release
--   still able to use the schema (`-- oldest release: X.Y.Z` in its first lines), written
--   by the migrator; the highest is the schema's floor, below which a release refuses to
--   start.
-- * replicas.oldest_peer: the oldest release each replica serves beside (NULL: a release
--   from before this rule), so that an older replica can tell it must not start.
-- An expansion: releases before this one never read either.
CREATE TABLE schema_contractions (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    oldest_release TEXT NOT NULL
);
ALTER TABLE replicas ADD COLUMN oldest_peer TEXT;
