-- The store's identity. A proxy instance remembers the store_id it
-- last used, outside the store (proxy/identity.py); finding another id, or a store
-- created since, means the store was deleted, replaced or recreated and its epochs may
-- restart below ones already acknowledged, so the proxy refuses to start.
-- fenced_at: when `store fence-restore` last advanced every epoch (NULL: never); a
-- proxy accepts a store fenced after it last started, whatever its id.
CREATE TABLE store_identity (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    store_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    fenced_at REAL
);
INSERT INTO store_identity (id, store_id, created_at)
VALUES (1, lower(hex(randomblob(16))), (julianday('now') - 2440587.5) * 86400.0);

-- /_fence/readyz proves a write works by writing one row per instance, at most about
-- once a second: a full disk or a read-only store fails it.
CREATE TABLE heartbeats (
    instance_id TEXT PRIMARY KEY,
    at REAL NOT NULL
);
