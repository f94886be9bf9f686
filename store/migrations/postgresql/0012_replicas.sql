-- The status page's service panel: see the SQLite migration 0014.
CREATE TABLE replicas (
    instance_id TEXT PRIMARY KEY,
    version TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    seen_at DOUBLE PRECISION NOT NULL,
    last_sweep_at DOUBLE PRECISION,
    last_probe_at DOUBLE PRECISION
);
CREATE INDEX replicas_by_seen ON replicas (seen_at);
