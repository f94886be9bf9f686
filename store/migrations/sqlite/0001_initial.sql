-- The highest epoch ever issued per resource: epochs only grow, so this row is
-- never deleted.
CREATE TABLE resources (
    resource TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL CHECK (epoch >= 1)
);

-- Every lease ever granted. Only the token's hash is kept.
CREATE TABLE leases (
    resource TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    holder TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    granted_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    PRIMARY KEY (resource, epoch)
);

CREATE TABLE effects (
    id TEXT PRIMARY KEY,
    route TEXT NOT NULL,
    resource TEXT NOT NULL,
    holder TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    idempotency_key TEXT,
    fingerprint TEXT NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    state TEXT NOT NULL,
    instance_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    deadline REAL NOT NULL,
    finished_at REAL,
    upstream_status INTEGER,
    reason TEXT
);
CREATE INDEX effects_in_doubt ON effects (resource, state)
    WHERE state IN ('DISPATCHING', 'UNKNOWN');
CREATE INDEX effects_by_resource ON effects (resource, created_at);

CREATE TABLE idempotency (
    resource TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    effect_id TEXT NOT NULL REFERENCES effects (id),
    epoch INTEGER NOT NULL,
    expires_at REAL NOT NULL,
    response_status INTEGER,
    response_headers TEXT,
    response_body BLOB,
    PRIMARY KEY (resource, key)
);
CREATE INDEX idempotency_expiry ON idempotency (expires_at);
CREATE INDEX idempotency_by_effect ON idempotency (effect_id);

CREATE TABLE rejections (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    code TEXT NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    route TEXT,
    resource TEXT,
    holder TEXT,
    epoch INTEGER,
    fingerprint TEXT
);
CREATE INDEX rejections_by_resource ON rejections (resource, id);
