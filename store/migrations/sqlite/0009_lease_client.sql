-- The authenticated client (policy `auth.clients[].name`, or 'admin' for the admin
-- token) that took the lease; NULL when the policy has no `auth:` block, or for
-- leases granted before it had one.
ALTER TABLE leases ADD COLUMN client TEXT;
