-- A quota subject's live leases are counted on every acquire (quotas.live_leases):
-- one index range per subject, never a pass over every lease ever granted. Partial:
-- released and revoked leases leave it.
CREATE INDEX leases_live_by_holder ON leases (holder, expires_at) WHERE ended_at IS NULL;
