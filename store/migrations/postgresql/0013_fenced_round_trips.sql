-- A fenced request in five round trips: the admission's read is one call,
-- the receipt one statement. Neither function decides anything: the rules stay in
-- core/ (Python); these only read what a decision needs, or write what one decided.

-- Everything an admission decides on, read under the resource's row lock: the token's
-- lease, the resource's epoch and current lease, the epoch floor, its effects in doubt,
-- and the key's record. A function, not one SELECT ... FOR UPDATE: under READ COMMITTED
-- a statement that waits for a lock still reads the other tables as of its start, so it
-- would miss what the lock's previous holder committed. Here the lock is taken first
-- (lock_resource's upsert), and the read that follows is a statement of its own, with a
-- snapshot taken once the lock is held. Only a token of this very resource takes it.
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
    IF EXISTS (SELECT 1 FROM leases l WHERE l.token_hash = p_token_hash
               AND l.resource = p_resource) THEN
        INSERT INTO resources AS r (resource, epoch) VALUES (p_resource, 0)
        ON CONFLICT (resource) DO UPDATE SET epoch = r.epoch;
    END IF;
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

-- A receipt decided in Python (core/lifecycle.py, from the state its admission left),
-- written in one statement that is its own transaction: under the resource's lock (as
-- every change to a resource's effects and keys), only if the effect is still in the
-- state the step was decided on (else nothing is written and applied is false: the
-- caller then records the receipt the long way). p_key is the step's key action (keep,
-- free, commit); p_conclusion NULL writes no history row. The time is the database's,
-- returned; the store id too, checked against the one the proxy opened (p_store_id):
-- a different store gets nothing written.
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
    v_retain_s DOUBLE PRECISION;
BEGIN
    SELECT s.store_id INTO v_store_id FROM store_identity s;
    IF v_store_id IS DISTINCT FROM p_store_id THEN
        RETURN QUERY SELECT v_store_id, NULL::float8, false;
        RETURN;
    END IF;
    INSERT INTO resources AS r (resource, epoch) VALUES (p_resource, 0)
    ON CONFLICT (resource) DO UPDATE SET epoch = r.epoch;
    SELECT extract(epoch FROM clock_timestamp())::float8 + m.clock_offset_s INTO v_now
    FROM store_meta m;
    UPDATE effects e SET state = p_state, finished_at = v_now,
                         upstream_status = p_upstream_status, reason = p_reason,
                         settled_by = NULL,
                         next_probe_at = CASE WHEN p_probe_now THEN v_now END,
                         probe_claimed_by = NULL, probe_claimed_until = NULL
    WHERE e.id = p_id AND e.state = p_expected
    RETURNING e.retain_s INTO v_retain_s;
    IF NOT FOUND THEN
        RETURN QUERY SELECT v_store_id, v_now, false;
        RETURN;
    END IF;
    IF p_key = 'free' THEN
        DELETE FROM idempotency WHERE effect_id = p_id;
    ELSIF p_key = 'commit' THEN
        INSERT INTO idempotency AS i (resource, key, fingerprint, effect_id, epoch,
                                      expires_at, response_status, response_headers,
                                      response_body, settled_by)
        VALUES (p_resource, p_idempotency_key, p_fingerprint, p_id, p_epoch,
                v_now + COALESCE(v_retain_s, p_default_retain_s), p_status, p_headers,
                p_body, p_key_settled_by)
        -- As commit_idempotency_key: a response this very effect's receipt kept stays.
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
    END IF;
    IF p_conclusion IS NOT NULL THEN
        INSERT INTO effect_events (effect_id, at, kind, actor, upstream_status, conclusion,
                                   detail)
        VALUES (p_id, v_now, p_kind, p_actor, p_upstream_status, p_conclusion, p_reason);
    END IF;
    RETURN QUERY SELECT v_store_id, v_now, true;
END
$$;
