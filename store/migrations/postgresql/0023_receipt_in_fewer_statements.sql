-- PostgreSQL's own CPU per fenced write, a fourth pass (bench/README.md has the profile):
-- two statements fewer per receipt. Nothing the receipt decides, writes or returns changes.
-- Each statement a PL/pgSQL function runs costs its executor start-up (the plan's locks,
-- its relations and their indexes opened), more than the rows a receipt writes.
-- * The effect's update and the key commit are one statement (a data-modifying CTE): the
--   key is committed only if the update found the effect in the expected state, as
--   before. The upsert is still fenceproxy_commit_key's statement
--   (tests/integration/app/test_store_postgres.py compares the two in every branch).
-- * The check that another open effect holds the key runs only when the step frees the
--   key: written as one condition with the other, it was a query run (and started up)
--   on every receipt.

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
