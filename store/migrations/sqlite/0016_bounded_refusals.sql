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

-- The last batch of counts each flusher (one per open store, store/refusals.py) wrote,
-- recorded in the transaction that writes the batch: a batch retried after a flush was
-- cancelled mid-write (the proxy's shutdown does that) is seen as written and skipped,
-- never counted twice.
CREATE TABLE refusal_batches (
    flusher TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    at REAL NOT NULL
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
)
GROUP BY resource, code, route, epoch, holder
ON CONFLICT DO NOTHING;
INSERT INTO refusals (resource, code, route, epoch, holder, client, count, first_seen,
                      last_seen, method, path, fingerprint)
SELECT coalesce(r.resource, ''), c.code, c.route, 0, '', '', sum(c.count), min(c.first_seen),
       max(c.last_seen), max(c.method), max(c.path), NULL
FROM refusal_counts c LEFT JOIN resources r ON r.resource = c.resource
GROUP BY coalesce(r.resource, ''), c.code, c.route
ON CONFLICT (resource, code, route, epoch, holder, client) DO UPDATE SET
    count = refusals.count + excluded.count,
    first_seen = min(refusals.first_seen, excluded.first_seen),
    last_seen = max(refusals.last_seen, excluded.last_seen);
DROP TABLE rejections;
DROP TABLE refusal_counts;
