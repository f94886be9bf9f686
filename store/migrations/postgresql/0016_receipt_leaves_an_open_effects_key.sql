-- The receipt of migration 0013, with one more case in which it writes nothing: a
-- receipt that frees the effect's key (a definite "not committed", nothing sent) while
-- another effect under the same key is still open (a resend on its way, an earlier
-- send in dispute). The key belongs to that effect (core/lifecycle.py key_heir), and
-- who inherits it is decided in Python: applied is false, and the caller records the
-- receipt the long way, which passes the key on (pass_idempotency_key): a freed
-- key must not leave an open effect without its record.
CREATE OR REPLACE FUNCTION fenceproxy_receipt(
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
    IF p_key = 'free' AND EXISTS (
        SELECT 1 FROM effects o
        WHERE o.resource = p_resource AND o.idempotency_key = p_idempotency_key
          AND o.id <> p_id AND o.state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING')
    ) THEN
        RETURN QUERY SELECT v_store_id, v_now, false;
        RETURN;
    END IF;
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
