-- The PostgreSQL schema: the same records as the SQLite one. Times are seconds
-- since the Unix epoch as judged by the database's clock.

-- epoch_floor: no epoch at or below it is issued (raised by `store fence-restore`).
-- clock_offset_s: added to the database's clock for every replica at once; 0 in
-- production, moved by tests that need time to pass without waiting.
CREATE TABLE store_meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch_floor BIGINT NOT NULL,
    clock_offset_s DOUBLE PRECISION NOT NULL DEFAULT 0
);
INSERT INTO store_meta (id, epoch_floor) VALUES (1, 0);

-- The highest epoch issued per resource (0: a row created only to lock it).
CREATE TABLE resources (
    resource TEXT PRIMARY KEY,
    epoch BIGINT NOT NULL CHECK (epoch >= 0)
);

CREATE TABLE leases (
    resource TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    holder TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    granted_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION,
    end_reason TEXT,
    PRIMARY KEY (resource, epoch)
);

CREATE TABLE effects (
    id TEXT PRIMARY KEY,
    route TEXT NOT NULL,
    resource TEXT NOT NULL,
    holder TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    idempotency_key TEXT,
    fingerprint TEXT NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    state TEXT NOT NULL,
    instance_id TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    deadline DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION,
    upstream_status INTEGER,
    reason TEXT,
    probe_attempts INTEGER NOT NULL DEFAULT 0,
    next_probe_at DOUBLE PRECISION,
    probe_claimed_by TEXT,
    probe_claimed_until DOUBLE PRECISION,
    settled_by TEXT
);
CREATE INDEX effects_in_doubt ON effects (resource, state)
    WHERE state IN ('DISPATCHING', 'UNKNOWN');
CREATE INDEX effects_by_resource ON effects (resource, created_at);
CREATE INDEX effects_due_probes ON effects (next_probe_at) WHERE state = 'UNKNOWN';

CREATE TABLE idempotency (
    resource TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    effect_id TEXT NOT NULL REFERENCES effects (id),
    epoch BIGINT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    response_status INTEGER,
    response_headers TEXT,
    response_body BYTEA,
    settled_by TEXT,
    PRIMARY KEY (resource, key)
);
CREATE INDEX idempotency_expiry ON idempotency (expires_at);
CREATE INDEX idempotency_by_effect ON idempotency (effect_id);

CREATE TABLE rejections (
    id BIGSERIAL PRIMARY KEY,
    at DOUBLE PRECISION NOT NULL,
    code TEXT NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    route TEXT,
    resource TEXT,
    holder TEXT,
    epoch BIGINT,
    fingerprint TEXT
);
CREATE INDEX rejections_by_resource ON rejections (resource, id);

CREATE TABLE effect_events (
    id BIGSERIAL PRIMARY KEY,
    effect_id TEXT NOT NULL REFERENCES effects (id),
    at DOUBLE PRECISION NOT NULL,
    kind TEXT NOT NULL,
    actor TEXT NOT NULL,
    upstream_status INTEGER,
    conclusion TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX effect_events_by_effect ON effect_events (effect_id, id);
