-- The PostgreSQL connector's own statements (store/postgres.py), as named blocks: the
-- clock and the store's id every transaction reads, and the checks of the server before
-- the store opens. SQLite's connector has its own clock and one file, so these have no
-- counterpart in sqlite.sql.

-- clock --
-- The authority's clock: the database's, shared by every replica (see store_meta); and,
-- in the same round trip, the store's id, so that every transaction checks it is still
-- talking to the store it opened: a database dropped and created again behind the same
-- URL would hand out epochs from 1. The time when the operation starts
-- (clock_timestamp()), not now(), the transaction's start: in a batch of writes
-- (store/operation_queue.py) an operation runs after the ones before it, and must not
-- judge a lease at a moment that has passed.
SELECT extract(epoch FROM clock_timestamp())::float8 + m.clock_offset_s AS now, i.store_id
FROM store_meta m, store_identity i

-- store_id --
SELECT store_id FROM store_identity

-- server_writable --
-- A hot standby (in recovery) and a read-only database take no writes.
SELECT pg_is_in_recovery() AS standby,
    current_setting('transaction_read_only') = 'on' AS read_only

-- backend_pid --
-- Two client connections served by one server backend: a pooler in transaction mode.
SELECT pg_backend_pid() AS pid
