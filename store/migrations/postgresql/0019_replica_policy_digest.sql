-- Which policy each replica serves: see the SQLite migration 0018.
ALTER TABLE replicas ADD COLUMN policy_digest TEXT;
