-- Refusals of requests that carry no valid credential (no_route, missing_token, ...),
-- counted rather than kept one row each: anyone can send them, so
-- one row per request would let a client without a token fill the disk.
-- One row per (code, route, resource, method, path); route and resource are '' when
-- there is none, so the key has no NULL (a NULL would never conflict, and the upsert
-- would insert each time). The resource comes from the path (a route's template), so
-- it adds no kind of its own; it is kept so that ?resource= still finds them.
-- The path is stored truncated and, past a number of distinct rows per code, folded
-- into one '<other>' row (store/manager.py): the table is bounded whatever arrives,
-- so it needs no index beyond its key.
CREATE TABLE refusal_counts (
    code TEXT NOT NULL,
    route TEXT NOT NULL,
    resource TEXT NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    first_seen DOUBLE PRECISION NOT NULL,
    last_seen DOUBLE PRECISION NOT NULL,
    count BIGINT NOT NULL,
    PRIMARY KEY (code, route, resource, method, path)
);
