-- The refusal record, bounded by what exists rather than by requests.
-- One row per (resource, code, route, epoch, holder, client) with its count, first and
-- last time seen, and a sample of the latest request (method, truncated path and body
-- fingerprint; never a body, a token or a header). '' and 0 stand for "none", so the key
-- has no NULL (a NULL never conflicts, and the upsert would insert each time).
-- A name is kept only if it exists when the count is written (store/refusals.py): the
-- resource if `resources` has it, the epoch if a lease of that resource had it, the
-- holder if it held that lease. Route and client come from the configuration (a route's
-- name, an authenticated client's). So any number of refusals, of any kind and from
-- anyone, adds at most a row per lease granted, resource, route and client.
-- refusals_by_last_seen serves the newest-first listing and retention; it costs each
-- flush an index entry per row written, not per refusal.
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
-- never counted twice. Its row lock also orders a retry after a cancelled attempt
-- that is still committing.
CREATE TABLE refusal_batches (
    flusher TEXT PRIMARY KEY,
    seq BIGINT NOT NULL,
    at DOUBLE PRECISION NOT NULL
);

-- What the two former tables hold, under the same rule. The per-request rows are
-- collapsed into counts; the counted ones lose their path from the key (kept as sample).
INSERT INTO refusals (resource, code, route, epoch, holder, client, count, first_seen,
                      last_seen, method, path, fingerprint)
SELECT resource, code, route, epoch, holder, '', count(*), min(at), max(at), max(method),
       max(path), max(fingerprint)
FROM (
    SELECT coalesce(r.resource, '') AS resource, j.code, coalesce(j.route, '') AS route,
           CASE WHEN l.resource IS NULL THEN 0 ELSE j.epoch END AS epoch,
           CASE WHEN l.holder = j.holder THEN j.holder ELSE '' END AS holder,
           j.at, j.method, j.path, j.fingerprint
    FROM rejections j
    LEFT JOIN resources r ON r.resource = j.resource
    LEFT JOIN leases l ON l.resource = r.resource AND l.epoch = j.epoch
) AS kept
GROUP BY resource, code, route, epoch, holder;
INSERT INTO refusals (resource, code, route, epoch, holder, client, count, first_seen,
                      last_seen, method, path, fingerprint)
SELECT coalesce(r.resource, ''), c.code, c.route, 0, '', '', sum(c.count), min(c.first_seen),
       max(c.last_seen), max(c.method), max(c.path), NULL
FROM refusal_counts c LEFT JOIN resources r ON r.resource = c.resource
GROUP BY coalesce(r.resource, ''), c.code, c.route
ON CONFLICT (resource, code, route, epoch, holder, client) DO UPDATE SET
    count = refusals.count + excluded.count,
    first_seen = least(refusals.first_seen, excluded.first_seen),
    last_seen = greatest(refusals.last_seen, excluded.last_seen);
DROP TABLE rejections;
DROP TABLE refusal_counts;

-- The admission's lock on the resource row (migration 0013) taken without updating the
-- row (WHERE FALSE: PostgreSQL locks the conflicting row all the same). The update left
-- a row version per admission, refused ones included: a flood of refused writes grew
-- resources by megabytes until a vacuum. Otherwise unchanged.
CREATE OR REPLACE FUNCTION fenceproxy_admission_state(p_token_hash TEXT, p_resource TEXT, p_key TEXT)
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
        ON CONFLICT (resource) DO UPDATE SET epoch = r.epoch WHERE FALSE;
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
