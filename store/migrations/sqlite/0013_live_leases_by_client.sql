-- With `auth:` a quota subject is the client that took a lease: its live
-- leases are counted on every acquire, one index range per client.
CREATE INDEX leases_live_by_client ON leases (client, expires_at) WHERE ended_at IS NULL;
