-- Which policy each replica serves: the sha256 of its policy file's bytes (NULL: a
-- replica of an older version, or one built without a file), written with the rest of
-- its row, so that replicas serving different policies can be told apart
-- (fenceproxy status, /_fence/readyz, the status page).
ALTER TABLE replicas ADD COLUMN policy_digest TEXT;
