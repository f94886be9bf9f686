-- The SQLite store as it is now: every table and index, and the rows a new store starts
-- with. A new file is created from this file alone (and recorded as at the latest
-- migration); a store created before is brought here by the migrations in
-- store/migrations/sqlite, which stay as the deltas between versions. A change to the
-- schema is an edit of this file and a new migration that makes the same change to an
-- existing store; tests/integration/app/test_schema_files.py fails while migrating from
-- the first migration does not end exactly here (sqlite_master, normalised, and the
-- rows below). The records are the PostgreSQL store's (store/schema/postgresql.sql), which
-- also says what each column means; here times are the proxy's clock, in seconds since
-- the Unix epoch, and there is no standby, so no history to check.

-- The store's one row: the epoch floor (no epoch at or below it is issued), where
-- retention's sweep of the resources table stopped, and the recovery window, which a
-- SQLite store never opens itself (the columns keep the two schemas answering the same
-- queries; an operator may close one left by a store copied from PostgreSQL's records).
CREATE TABLE store_meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch_floor INTEGER NOT NULL,
    resources_swept_to TEXT NOT NULL DEFAULT '',
    recovery_opened_at REAL,
    recovery_reason TEXT
);
INSERT INTO store_meta (id, epoch_floor) VALUES (1, 0);

-- The store's identity (proxy/identity.py): a random id for every new file, and when
-- `store fence-restore` last advanced every epoch.
CREATE TABLE store_identity (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    store_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    fenced_at REAL
);
INSERT INTO store_identity (id, store_id, created_at)
VALUES (1, lower(hex(randomblob(16))), (julianday('now') - 2440587.5) * 86400.0);

-- The highest epoch issued per resource. No row is written only to lock it: BEGIN
-- IMMEDIATE serialises every writer on the file.
CREATE TABLE resources (
    resource TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL CHECK (epoch >= 1)
);

-- Every lease granted, kept until retention takes it; only the token's hash is kept.
CREATE TABLE leases (
    resource TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    holder TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    granted_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    client TEXT,
    granted_ttl_s REAL,
    renewals INTEGER NOT NULL DEFAULT 0,
    last_ttl_s REAL,
    came_back_at REAL,
    PRIMARY KEY (resource, epoch)
);
CREATE INDEX leases_by_expiry ON leases (expires_at);
CREATE INDEX leases_by_grant ON leases (granted_at);
CREATE INDEX leases_live_by_holder ON leases (holder, expires_at) WHERE ended_at IS NULL;
CREATE INDEX leases_live_by_client ON leases (client, expires_at) WHERE ended_at IS NULL;

-- Every write admitted, with its lifecycle state and what probing it has done.
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
    reason TEXT,
    probe_attempts INTEGER NOT NULL DEFAULT 0,
    next_probe_at REAL,
    probe_claimed_by TEXT,
    probe_claimed_until REAL,
    settled_by TEXT,
    retain_s REAL
);
-- The partial indexes on the state spell their predicates as ORs of equalities, not
-- `state IN (...)`: SQLite evaluates an IN-list predicate of a partial index at a cost of
-- its own on every row written (measured on 3.40, a receipt's UPDATE of one effect took
-- 180 µs of CPU with IN, 6 µs with OR). A query uses a partial index only if its WHERE
-- holds the index's predicate as written, so store/sqlite.sql spells them the same way.
CREATE INDEX effects_by_resource ON effects (resource, created_at);
CREATE INDEX effects_due_probes ON effects (next_probe_at) WHERE state = 'UNKNOWN';
CREATE INDEX effects_dispatching ON effects (deadline) WHERE state = 'DISPATCHING';
CREATE INDEX effects_by_time ON effects (created_at);
CREATE INDEX effects_in_doubt ON effects (resource, created_at)
    WHERE state = 'DISPATCHING' OR state = 'UNKNOWN' OR state = 'CONFLICTING';
CREATE INDEX effects_open ON effects (created_at)
    WHERE state = 'DISPATCHING' OR state = 'UNKNOWN' OR state = 'CONFLICTING';
CREATE INDEX effects_settled ON effects (state, created_at)
    WHERE state = 'COMMITTED' OR state = 'NOT_COMMITTED' OR state = 'NOT_SENT';

-- An idempotency key's record (expires_at NULL while its effect is not settled).
CREATE TABLE idempotency (
    resource TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    effect_id TEXT NOT NULL REFERENCES effects (id),
    epoch INTEGER NOT NULL,
    expires_at REAL,
    response_status INTEGER,
    response_headers TEXT,
    response_body BLOB,
    settled_by TEXT,
    PRIMARY KEY (resource, key)
);
CREATE INDEX idempotency_expiry ON idempotency (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX idempotency_by_effect ON idempotency (effect_id);

-- Every decision about an effect, for `effects show`.
CREATE TABLE effect_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    effect_id TEXT NOT NULL REFERENCES effects (id),
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    actor TEXT NOT NULL,
    upstream_status INTEGER,
    conclusion TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX effect_events_by_effect ON effect_events (effect_id, id);

-- /_fence/readyz's proof that a write works: one row per instance.
CREATE TABLE heartbeats (
    instance_id TEXT PRIMARY KEY,
    at REAL NOT NULL
);

-- The refusal record, bounded by what exists rather than by requests.
CREATE TABLE refusals (
    resource TEXT NOT NULL,
    code TEXT NOT NULL,
    route TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    holder TEXT NOT NULL,
    client TEXT NOT NULL,
    count INTEGER NOT NULL,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    fingerprint TEXT,
    PRIMARY KEY (resource, code, route, epoch, holder, client)
) WITHOUT ROWID;
CREATE INDEX refusals_by_last_seen ON refusals (last_seen);

-- The last batch of counts each flusher wrote, so that a retried batch is never counted
-- twice.
CREATE TABLE refusal_batches (
    flusher TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    at REAL NOT NULL
);

-- The status page's service panel: one row per proxy instance.
CREATE TABLE replicas (
    instance_id TEXT PRIMARY KEY,
    version TEXT NOT NULL,
    started_at REAL NOT NULL,
    seen_at REAL NOT NULL,
    last_sweep_at REAL,
    last_probe_at REAL,
    policy_digest TEXT,
    -- The oldest release this replica serves beside (core/releases.py); NULL: a release
    -- from before that rule.
    oldest_peer TEXT
);
CREATE INDEX replicas_by_seen ON replicas (seen_at);

-- One row per applied migration that declared the oldest release still able to use the
-- schema (`-- oldest release: X.Y.Z` in its first lines; store/schema.py): the highest
-- is the schema's floor, below which a release refuses to start (core/releases.py).
CREATE TABLE schema_contractions (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    oldest_release TEXT NOT NULL
);
