-- Every lease's whole life, for `fenceproxy lease-advice`. Additive only:
-- new nullable (or defaulted) columns and an index.
-- * granted_ttl_s: the TTL its holder asked for at grant (NULL: granted before this).
-- * renewals, last_ttl_s: how often it was renewed, and the TTL of the last renewal.
-- * came_back_at: when its holder presented the token after the lease had expired
--   (a renew, release or fenced write refused as lease_expired or stale_epoch, or a
--   release of the expired lease): the holder was alive, so the expiry was false.
-- How a lease ended is end_reason: 'released', 'revoked: ...', 'fence-restore', and
-- 'superseded' (expired, then taken over); a lease past expires_at that nobody ended
-- expired. The advice reads leases granted since a moment: leases_by_grant.
ALTER TABLE leases ADD COLUMN granted_ttl_s REAL;
ALTER TABLE leases ADD COLUMN renewals INTEGER NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN last_ttl_s REAL;
ALTER TABLE leases ADD COLUMN came_back_at REAL;
CREATE INDEX leases_by_grant ON leases (granted_at);
