-- The PostgreSQL store as it is now: every table, index and function, and the rows a
-- new store starts with. A new database is created from this file alone (and recorded as
-- at the latest migration); a store created before is brought here by the migrations in
-- store/migrations/postgresql, which stay as the deltas between versions. A change to the
-- schema is an edit of this file and a new migration that makes the same change to an
-- existing store; tests/integration/app/test_schema_files.py fails while migrating from
-- the first migration does not end exactly here (every table, column, constraint, index,
-- sequence, trigger and function, and the rows below). The SQLite store's
-- store/schema/sqlite.sql holds the same records.
--
-- Times are seconds since the Unix epoch as judged by the database's clock
-- (extract(epoch FROM clock_timestamp()) + store_meta.clock_offset_s).

-- The store's one row of settings and state.
-- * epoch_floor: no epoch at or below it is issued (raised by `store fence-restore`, by
--   the recovery after lost history, and by retention when it deletes a resource row).
-- * clock_offset_s: added to the database's clock for every replica at once; 0 in
--   production, moved by tests that need time to pass without waiting.
-- * resources_swept_to: where retention's sweep of the resources table (in key order,
--   `batch` rows a pass) stopped; the next pass goes on after it, and after the last row
--   it starts again from the first.
-- * history_timeline: the PostgreSQL timeline this store last wrote on (NULL until a
--   replica first checked it). A promoted standby, or a point-in-time restore, starts a
--   new timeline: the history after its branch point may be lost (store/history.py).
-- * recovery_opened_at / recovery_reason: the recovery window opened when lost history
--   was detected; while open, an idempotency key the store does not know is unknown, not
--   new. Closed (NULL) by an operator: `fenceproxy store close-recovery`.
-- * history_server_started: with history_timeline, the server (its timeline and its
--   postmaster's start) the last recovery was made on: a replica that finds a loss
--   recovers it unless one was made on this very server since it last changed (a restore
--   or an old primary coming back is a restart; a promotion a new timeline).
CREATE TABLE store_meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch_floor BIGINT NOT NULL,
    clock_offset_s DOUBLE PRECISION NOT NULL DEFAULT 0,
    resources_swept_to TEXT NOT NULL DEFAULT '',
    history_timeline BIGINT,
    recovery_opened_at DOUBLE PRECISION,
    recovery_reason TEXT,
    history_server_started DOUBLE PRECISION
);
INSERT INTO store_meta (id, epoch_floor) VALUES (1, 0);

-- The store's identity. A proxy instance remembers the store_id it last used, outside
-- the store (proxy/identity.py); finding another id, or a store created since, means the
-- store was deleted, replaced or recreated and its epochs may restart below ones already
-- acknowledged, so the proxy refuses to start. A new database gets a new random id (an
-- empty database cannot be told from a fresh one by anything inside it).
-- fenced_at: when `store fence-restore` last advanced every epoch (NULL: never); a proxy
-- accepts a store fenced after it last started, whatever its id.
CREATE TABLE store_identity (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    store_id TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    fenced_at DOUBLE PRECISION
);
INSERT INTO store_identity (id, store_id, created_at)
VALUES (1, md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text),
        extract(epoch FROM now())::float8);

-- The highest epoch issued per resource (0: a row created only to lock it). Every
-- decision about a resource first takes its row's lock (store/postgres.sql,
-- lock_resource).
CREATE TABLE resources (
    resource TEXT PRIMARY KEY,
    epoch BIGINT NOT NULL CHECK (epoch >= 0)
);

-- Every lease granted, kept until retention takes it; only the token's hash is kept.
-- * client: the authenticated client (policy `auth.clients[].name`, or 'admin' for the
--   admin token) that took it; NULL when the policy has no `auth:` block.
-- * granted_ttl_s: the TTL its holder asked for at grant; renewals and last_ttl_s: how
--   often it was renewed, and the TTL of the last renewal (for `fenceproxy lease-advice`).
-- * came_back_at: when its holder presented the token after the lease had expired (a
--   renew, release or fenced write refused as lease_expired or stale_epoch, or a release
--   of the expired lease): the holder was alive, so the expiry was false.
-- How a lease ended is end_reason: 'released', 'revoked: ...', 'fence-restore',
-- 'failover' and 'superseded' (expired, then taken over); a lease past expires_at that
-- nobody ended expired.
CREATE TABLE leases (
    resource TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    holder TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    granted_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION,
    end_reason TEXT,
    client TEXT,
    granted_ttl_s DOUBLE PRECISION,
    renewals BIGINT NOT NULL DEFAULT 0,
    last_ttl_s DOUBLE PRECISION,
    came_back_at DOUBLE PRECISION,
    PRIMARY KEY (resource, epoch)
);
-- Retention reads the leases that expired before its horizon (none of them can be live
-- again: a lease is renewed only while it is live); the advice those granted since a
-- moment.
CREATE INDEX leases_by_expiry ON leases (expires_at);
CREATE INDEX leases_by_grant ON leases (granted_at);
-- A quota subject's live leases are counted on every acquire: one index range per holder
-- (or, with `auth:`, per client), never a pass over every lease ever granted. Partial:
-- released and revoked leases leave them.
CREATE INDEX leases_live_by_holder ON leases (holder, expires_at) WHERE ended_at IS NULL;
CREATE INDEX leases_live_by_client ON leases (client, expires_at) WHERE ended_at IS NULL;

-- Every write admitted, with its lifecycle state (core/lifecycle.py) and what probing it
-- has done. retain_s: how long its key replays once it settled (its route's, remembered
-- from its admission).
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
    settled_by TEXT,
    retain_s DOUBLE PRECISION
);
-- Every background pass, listing and metrics query reads a bounded range of an index,
-- never the whole table:
-- * effects_in_doubt: an admission reads its resource's unsettled effects (DISPATCHING,
--   UNKNOWN, CONFLICTING block their resource) in creation order; the listings over
--   every resource read all of it (it holds few rows) and sort what is in doubt.
-- * effects_due_probes: UNKNOWN effects due for a probe; effects_dispatching:
--   DISPATCHING ones past their deadline.
-- * effects_settled: the settled effects of each state by creation. Retention reads
--   those created before its horizon (an effect settles after it is created, so that
--   range holds every one that settled before the horizon); `effects --state COMMITTED`
--   lists from it newest first.
-- * effects_by_time: `effects` newest first; effects_by_resource: a resource's.
CREATE INDEX effects_by_resource ON effects (resource, created_at);
CREATE INDEX effects_due_probes ON effects (next_probe_at) WHERE state = 'UNKNOWN';
CREATE INDEX effects_in_doubt ON effects (resource, created_at)
    WHERE state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING');
CREATE INDEX effects_dispatching ON effects (deadline) WHERE state = 'DISPATCHING';
CREATE INDEX effects_settled ON effects (state, created_at)
    WHERE state IN ('COMMITTED', 'NOT_COMMITTED', 'NOT_SENT');
CREATE INDEX effects_by_time ON effects (created_at);

-- An idempotency key's record: the effect that holds it and, once that settled, the
-- response it replays until expires_at (NULL while its effect is not settled: a settled
-- key is kept for its route's retain_s from the moment it settled). settled_by: who
-- settled a committed effect whose response was never seen (it has none to replay).
CREATE TABLE idempotency (
    resource TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    effect_id TEXT NOT NULL REFERENCES effects (id),
    epoch BIGINT NOT NULL,
    expires_at DOUBLE PRECISION,
    response_status INTEGER,
    response_headers TEXT,
    response_body BYTEA,
    settled_by TEXT,
    PRIMARY KEY (resource, key)
);
CREATE INDEX idempotency_by_effect ON idempotency (effect_id);
CREATE INDEX idempotency_expiry ON idempotency (expires_at) WHERE expires_at IS NOT NULL;

-- Every decision about an effect (a probe attempt, a restart's recovery, an operator's
-- resolution), so `effects show` can tell who decided what, when and why.
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

-- /_fence/readyz proves a write works by writing one row per instance, at most about
-- once a second: a full disk or a read-only store fails it.
CREATE TABLE heartbeats (
    instance_id TEXT PRIMARY KEY,
    at DOUBLE PRECISION NOT NULL
);

-- The refusal record, bounded by what exists rather than by requests. One row per
-- (resource, code, route, epoch, holder, client) with its count, first and last time
-- seen, and a sample of the latest request (method, truncated path and body fingerprint;
-- never a body, a token or a header). '' and 0 stand for "none", so the key has no NULL
-- (a NULL never conflicts, and the upsert would insert each time). A name is kept only if
-- it exists when the count is written (store/refusals.py): the resource if `resources`
-- has it, the epoch if a lease of that resource had it, the holder if it held that lease.
-- Route and client come from the configuration. So any number of refusals, of any kind
-- and from anyone, adds at most a row per lease granted, resource, route and client.
-- refusals_by_last_seen serves the newest-first listing and retention.
CREATE TABLE refusals (
    resource TEXT NOT NULL,
    code TEXT NOT NULL,
    route TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    holder TEXT NOT NULL,
    client TEXT NOT NULL,
    count BIGINT NOT NULL,
    first_seen DOUBLE PRECISION NOT NULL,
    last_seen DOUBLE PRECISION NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    fingerprint TEXT,
    PRIMARY KEY (resource, code, route, epoch, holder, client)
);
CREATE INDEX refusals_by_last_seen ON refusals (last_seen);

-- The last batch of counts each flusher (one per open store, store/refusals.py) wrote,
-- recorded in the transaction that writes the batch: a batch retried after a flush was
-- cancelled mid-write (the proxy's shutdown does that) is seen as written and skipped,
-- never counted twice. Its row lock also orders a retry after a cancelled attempt that
-- is still committing.
CREATE TABLE refusal_batches (
    flusher TEXT PRIMARY KEY,
    seq BIGINT NOT NULL,
    at DOUBLE PRECISION NOT NULL
);

-- The status page's service panel: every proxy instance writes its row from the
-- reconciler's loop every few seconds, one row per instance id (a restarted instance
-- overwrites its own). policy_digest: the sha256 of the policy file it serves (NULL: a
-- replica of an older version, or one built without a file).
CREATE TABLE replicas (
    instance_id TEXT PRIMARY KEY,
    version TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    seen_at DOUBLE PRECISION NOT NULL,
    last_sweep_at DOUBLE PRECISION,
    last_probe_at DOUBLE PRECISION,
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

-- A fenced request in five round trips: the admission's read is one call
-- (fenceproxy_admission_state), the receipt one statement (fenceproxy_receipt). Neither
-- function decides anything: the rules stay in core/ (Python); these only read what a
-- decision needs, or write what one decided. PL/pgSQL, whose plans are kept for the
-- session (a LANGUAGE sql function that is not inlined plans its body on every call).

-- Everything an admission decides on, read under the resource's row lock: the token's
-- lease, the resource's epoch and current lease, the epoch floor, its effects in doubt,
-- and the key's record. A function, not one SELECT ... FOR UPDATE: under READ COMMITTED
-- a statement that waits for a lock still reads the other tables as of its start, so it
-- would miss what the lock's previous holder committed. Here the lock is taken first (as
-- lock_resource: WHERE FALSE locks the row without writing a row version), and the read
-- that follows is a statement of its own, with a snapshot taken once the lock is held.
-- Only a token of this very resource takes it.
CREATE FUNCTION fenceproxy_admission_state(p_token_hash TEXT, p_resource TEXT, p_key TEXT)
RETURNS TABLE (
    now DOUBLE PRECISION, store_id TEXT,
    t_resource TEXT, t_epoch BIGINT, t_holder TEXT, t_granted_at DOUBLE PRECISION,
    t_expires_at DOUBLE PRECISION, t_ended_at DOUBLE PRECISION, t_end_reason TEXT,
    t_client TEXT,
    epoch BIGINT, epoch_floor BIGINT, holder TEXT, granted_at DOUBLE PRECISION,
    expires_at DOUBLE PRECISION, ended_at DOUBLE PRECISION, end_reason TEXT, client TEXT,
    open_effects TEXT,
    i_fingerprint TEXT, i_effect_id TEXT, i_effect_state TEXT, i_epoch BIGINT,
    i_expires_at DOUBLE PRECISION, i_response_status INTEGER, i_response_headers TEXT,
    i_response_body BYTEA, i_settled_by TEXT
)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO resources AS r (resource, epoch)
    SELECT p_resource, 0 WHERE EXISTS (SELECT 1 FROM leases l
                                       WHERE l.token_hash = p_token_hash
                                         AND l.resource = p_resource)
    ON CONFLICT (resource) DO UPDATE SET epoch = r.epoch WHERE FALSE;
    RETURN QUERY
    SELECT extract(epoch FROM clock_timestamp())::float8 + m.clock_offset_s,
           (SELECT s.store_id FROM store_identity s),
           t.resource, t.epoch, t.holder, t.granted_at, t.expires_at, t.ended_at,
           t.end_reason, t.client,
           r.epoch, m.epoch_floor, l.holder, l.granted_at, l.expires_at, l.ended_at,
           l.end_reason, l.client,
           (SELECT COALESCE(json_agg(json_build_array(o.id, o.state, o.epoch,
                                                      o.idempotency_key, o.fingerprint)
                                     ORDER BY o.created_at), '[]')::text
            FROM effects o
            WHERE o.resource = p_resource
              AND o.state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING')),
           i.fingerprint, i.effect_id, e.state, i.epoch, i.expires_at, i.response_status,
           i.response_headers, i.response_body, i.settled_by
    FROM store_meta m
    LEFT JOIN leases t ON t.token_hash = p_token_hash
    LEFT JOIN resources r ON r.resource = p_resource
    LEFT JOIN leases l ON l.resource = r.resource AND l.epoch = r.epoch
    LEFT JOIN idempotency i ON i.resource = p_resource AND i.key = p_key
    LEFT JOIN effects e ON e.id = i.effect_id;
END
$$;

-- The key commit of the step-by-step receipt (store/postgres.sql's
-- commit_idempotency_key). fenceproxy_receipt writes the same statement itself (a call
-- fewer per fenced write: about 10 µs of the receipt's execution, bench/README.md);
-- tests/integration/app/test_store_postgres.py checks that the two leave the same key
-- row in every branch of the upsert. The operation took effect: from now on its key
-- replays (the response, if one was seen) until p_expires_at, whichever effect of the
-- operation held the key before. A response this very effect's receipt kept (before a
-- conflict) stays replayable. What to commit, and who settled it when no response was
-- seen, is core/lifecycle.py's `plan`; this only writes it.
CREATE FUNCTION fenceproxy_commit_key(
    p_resource TEXT, p_key TEXT, p_fingerprint TEXT, p_effect_id TEXT, p_epoch BIGINT,
    p_expires_at DOUBLE PRECISION, p_status INTEGER, p_headers TEXT, p_body BYTEA,
    p_settled_by TEXT
)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO idempotency AS i (resource, key, fingerprint, effect_id, epoch, expires_at,
                                  response_status, response_headers, response_body,
                                  settled_by)
    VALUES (p_resource, p_key, p_fingerprint, p_effect_id, p_epoch, p_expires_at,
            p_status, p_headers, p_body, p_settled_by)
    ON CONFLICT (resource, key) DO UPDATE SET
        fingerprint = excluded.fingerprint, effect_id = excluded.effect_id,
        epoch = excluded.epoch, expires_at = excluded.expires_at,
        response_status = CASE WHEN i.effect_id = excluded.effect_id
            THEN COALESCE(excluded.response_status, i.response_status)
            ELSE excluded.response_status END,
        response_headers = CASE WHEN i.effect_id = excluded.effect_id
            THEN COALESCE(excluded.response_headers, i.response_headers)
            ELSE excluded.response_headers END,
        response_body = CASE WHEN i.effect_id = excluded.effect_id
            THEN COALESCE(excluded.response_body, i.response_body)
            ELSE excluded.response_body END,
        settled_by = excluded.settled_by;
END
$$;

-- A receipt decided in Python (core/lifecycle.py, from the state its admission left),
-- written in one statement that is its own transaction: under the resource's lock (as
-- every change to a resource's effects and keys; taken, not rewritten, and only in the
-- store it was given), only if the effect is still in the state the step was decided on.
-- Else nothing is written and applied is false, and the caller records the receipt the
-- long way: so too when the receipt frees the effect's key (a definite "not committed",
-- nothing sent) while another effect under the same key is still open (a resend on its
-- way, an earlier send in dispute), whose key it is (core/lifecycle.py key_heir). p_key
-- is the step's key action (keep, free, commit); p_conclusion NULL writes no history
-- row. The time is the database's, read once the lock is held, and returned; the store
-- id too, checked against the one the proxy opened (p_store_id): a different store gets
-- nothing written.
CREATE FUNCTION fenceproxy_receipt(
    p_store_id TEXT, p_id TEXT, p_resource TEXT, p_expected TEXT, p_state TEXT,
    p_upstream_status INTEGER, p_reason TEXT, p_probe_now BOOLEAN,
    p_key TEXT, p_idempotency_key TEXT, p_fingerprint TEXT, p_epoch BIGINT,
    p_default_retain_s DOUBLE PRECISION, p_status INTEGER, p_headers TEXT, p_body BYTEA,
    p_key_settled_by TEXT,
    p_kind TEXT, p_actor TEXT, p_conclusion TEXT
)
RETURNS TABLE (store_id TEXT, now DOUBLE PRECISION, applied BOOLEAN)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_store_id TEXT;
    v_now DOUBLE PRECISION;
    v_settled BOOLEAN;
BEGIN
    -- The time is read once the lock is held: the aggregate waits for the upsert.
    WITH locked AS (
        INSERT INTO resources AS r (resource, epoch)
        SELECT p_resource, 0 FROM store_identity s WHERE s.store_id = p_store_id
        ON CONFLICT (resource) DO UPDATE SET epoch = r.epoch WHERE FALSE
        RETURNING 1
    )
    SELECT s.store_id, extract(epoch FROM clock_timestamp())::float8 + m.clock_offset_s
    INTO v_store_id, v_now
    FROM store_identity s, store_meta m, (SELECT count(*) FROM locked) AS held;
    store_id := v_store_id;
    now := v_now;
    applied := false;
    IF v_store_id IS DISTINCT FROM p_store_id THEN
        now := NULL;
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_key = 'free' THEN
        IF EXISTS (
            SELECT 1 FROM effects o
            WHERE o.resource = p_resource AND o.idempotency_key = p_idempotency_key
              AND o.id <> p_id AND o.state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING')
        ) THEN
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    -- The effect's update and the key commit (fenceproxy_commit_key's statement) in one
    -- statement; the key is committed only if the effect was updated.
    WITH settled AS (
        UPDATE effects e SET state = p_state, finished_at = v_now,
                             upstream_status = p_upstream_status, reason = p_reason,
                             settled_by = NULL,
                             next_probe_at = CASE WHEN p_probe_now THEN v_now END,
                             probe_claimed_by = NULL, probe_claimed_until = NULL
        WHERE e.id = p_id AND e.state = p_expected
        RETURNING e.retain_s
    ), committed AS (
        INSERT INTO idempotency AS i (resource, key, fingerprint, effect_id, epoch,
                                      expires_at, response_status, response_headers,
                                      response_body, settled_by)
        SELECT p_resource, p_idempotency_key, p_fingerprint, p_id, p_epoch,
               v_now + COALESCE(settled.retain_s, p_default_retain_s), p_status, p_headers,
               p_body, p_key_settled_by
        FROM settled WHERE p_key = 'commit'
        ON CONFLICT (resource, key) DO UPDATE SET
            fingerprint = excluded.fingerprint, effect_id = excluded.effect_id,
            epoch = excluded.epoch, expires_at = excluded.expires_at,
            response_status = CASE WHEN i.effect_id = excluded.effect_id
                THEN COALESCE(excluded.response_status, i.response_status)
                ELSE excluded.response_status END,
            response_headers = CASE WHEN i.effect_id = excluded.effect_id
                THEN COALESCE(excluded.response_headers, i.response_headers)
                ELSE excluded.response_headers END,
            response_body = CASE WHEN i.effect_id = excluded.effect_id
                THEN COALESCE(excluded.response_body, i.response_body)
                ELSE excluded.response_body END,
            settled_by = excluded.settled_by
    )
    SELECT true INTO v_settled FROM settled;
    IF NOT FOUND THEN
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_key = 'free' THEN
        DELETE FROM idempotency WHERE effect_id = p_id;
    END IF;
    IF p_conclusion IS NOT NULL THEN
        INSERT INTO effect_events (effect_id, at, kind, actor, upstream_status, conclusion,
                                   detail)
        VALUES (p_id, v_now, p_kind, p_actor, p_upstream_status, p_conclusion, p_reason);
    END IF;
    applied := true;
    RETURN NEXT;
END
$$;

-- Where this server's history is (store/history.py), told to the client as a NOTICE
-- ('fenceproxy history <walfile> <flushed lsn> <inserted lsn> <next xid> <own xid>'), so
-- that it rides on the BEGIN and COMMIT messages every transaction sends anyway (a
-- simple-query message returns no rows but does deliver notices): no round trip of its
-- own. The client judges it before it sends the transaction's first statement. On a
-- standby in recovery the WAL functions raise (55000): nothing runs there.
-- * The WAL position: the inserted one is judged (a server that holds less than was seen
--   went back), the flushed one kept (a crash loses WAL inserted but not flushed, which
--   no client was told was committed: no loss of history). Bytes, which a restarted
--   server also writes (its end-of-recovery checkpoint, full pages after it): a restore
--   can land past the position seen.
-- * Transaction ids, which only writes consume: just before its COMMIT a transaction
--   tells its own (0: it wrote nothing), kept once the COMMIT returned (durable with
--   synchronous_commit on, so never issued again after a crash); a server whose next one
--   is not past it lost that commit.
-- client_min_messages is raised to notice, for the rest of the transaction, only where
-- it would hide the notice (warning, error): a role that hides notices still hears.
CREATE FUNCTION fenceproxy_history_position() RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_flushed pg_lsn := pg_current_wal_flush_lsn();
BEGIN
    IF current_setting('client_min_messages') IN ('warning', 'error') THEN
        PERFORM set_config('client_min_messages', 'notice', true);
    END IF;
    RAISE NOTICE 'fenceproxy history % % % % %', pg_walfile_name(v_flushed), v_flushed,
        pg_current_wal_insert_lsn(), pg_snapshot_xmax(pg_current_snapshot()),
        COALESCE(pg_current_xact_id_if_assigned()::text, '0');
END
$$;
