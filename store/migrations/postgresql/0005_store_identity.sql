-- The store's identity: see the SQLite migration 0007. A new
-- PostgreSQL database gets a new random store_id, so a proxy instance that remembers
-- another one refuses to start on it (an empty database cannot be told from a fresh one
-- by anything inside it).
CREATE TABLE store_identity (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    store_id TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    fenced_at DOUBLE PRECISION
);
INSERT INTO store_identity (id, store_id, created_at)
VALUES (1, md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text),
        extract(epoch FROM now())::float8);

-- /_fence/readyz proves a write works (see the SQLite migration 0007).
CREATE TABLE heartbeats (
    instance_id TEXT PRIMARY KEY,
    at DOUBLE PRECISION NOT NULL
);
