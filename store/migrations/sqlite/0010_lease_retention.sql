-- Retention of leases and resources (policy `retention.leases_days`):
-- every acquire of a new name adds a resource row and a lease row, so without it the
-- store grows with every distinct name ever leased.
-- * leases_by_expiry: the collector reads the leases that expired before its horizon
--   (none of them can be live again: a lease is renewed only while it is live).
-- * store_meta.resources_swept_to: where the collector's sweep of the resources table
--   (in key order, `batch` rows a pass) stopped; the next pass goes on after it, and
--   after the last row it starts again from the first. A resource row goes once
--   nothing refers to it, and the epoch floor is raised to its epoch in the same
--   transaction, so the next acquire of that name still gets a higher epoch.
CREATE INDEX leases_by_expiry ON leases (expires_at);
ALTER TABLE store_meta ADD COLUMN resources_swept_to TEXT NOT NULL DEFAULT '';
