-- The status page's service panel: every proxy instance writes its row from
-- the reconciler's loop every few seconds (reconcile/prober.py REPLICA_BEAT_INTERVAL_S),
-- so the page can show each replica seen lately and what its background work last did.
-- One row per instance id, never more: a restarted instance overwrites its own.
CREATE TABLE replicas (
    instance_id TEXT PRIMARY KEY,
    version TEXT NOT NULL,
    started_at REAL NOT NULL,
    seen_at REAL NOT NULL,
    last_sweep_at REAL,
    last_probe_at REAL
);
CREATE INDEX replicas_by_seen ON replicas (seen_at);
