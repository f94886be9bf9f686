-- The PostgreSQL store's own history check (store/history.py, store/postgres.py), as
-- named blocks: SQLite has one process and one file, no standby, no timeline, so these
-- have no counterpart in sqlite.sql (whose blocks postgres.sql mirrors one for one).

-- history --
-- Where the database's history is (store/history.py) and the store's record of it: read
-- when the store opens and on every connection the pool opens (every transaction checks
-- in its BEGIN, migration 0018): the inserted position and the next transaction id are
-- judged, the flushed position kept. On a standby in recovery the WAL functions raise
-- (55000).
SELECT pg_walfile_name(pg_current_wal_flush_lsn()) AS walfile,
    pg_current_wal_flush_lsn()::text AS flushed, pg_current_wal_insert_lsn()::text AS inserted,
    pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid,
    extract(epoch FROM pg_postmaster_start_time())::float8 AS server_started,
    m.history_timeline, m.recovery_opened_at, m.recovery_reason, r.standbys, r.sync_states,
    current_setting('synchronous_standby_names') AS synchronous_standby_names,
    current_setting('synchronous_commit') AS synchronous_commit
FROM store_meta m,
    (SELECT count(*) AS standbys, array_agg(sync_state::text) AS sync_states
     FROM pg_stat_replication) r

-- history_unchecked --
-- The same where the WAL functions are refused (a role, a managed service): no check.
SELECT NULL::text AS walfile, NULL::text AS flushed, NULL::text AS inserted,
    NULL::bigint AS next_xid,
    NULL::float8 AS server_started,
    m.history_timeline, m.recovery_opened_at, m.recovery_reason, r.standbys, r.sync_states,
    current_setting('synchronous_standby_names') AS synchronous_standby_names,
    current_setting('synchronous_commit') AS synchronous_commit
FROM store_meta m,
    (SELECT count(*) AS standbys, array_agg(sync_state::text) AS sync_states
     FROM pg_stat_replication) r

-- record_history_timeline --
-- The first check on a store created before the history was recorded.
UPDATE store_meta SET history_timeline = :timeline WHERE history_timeline IS NULL

-- history_for_recovery --
-- Read under store_meta's row lock by the replica that recovers, so that two replicas
-- that found the same loss recover it once: the server the last recovery was made on,
-- the floor, and this server (its timeline, as the position judged, and its start).
SELECT m.history_timeline, m.history_server_started, m.recovery_opened_at,
    m.recovery_reason, m.epoch_floor,
    extract(epoch FROM pg_postmaster_start_time())::float8 AS server_started,
    extract(epoch FROM now())::float8 + m.clock_offset_s AS now
FROM store_meta m FOR UPDATE

-- record_recovery --
-- The recovery window opened, and the server it was made on.
UPDATE store_meta SET history_timeline = :timeline, history_server_started = :server_started,
    recovery_opened_at = :now, recovery_reason = :reason

-- begin_checked --
-- Every transaction's BEGIN and COMMIT messages carry the history check
-- (fenceproxy_history_position()): simple-query messages, which return no rows but
-- deliver the position as a notice, so the check costs no round trip. At BEGIN: judged
-- before the transaction's first statement is sent; on a standby in recovery it raises.
BEGIN; SELECT fenceproxy_history_position()

-- begin_checked_read_only --
-- A read's statements see one snapshot (REPEATABLE READ: under READ COMMITTED each
-- statement has its own); read-only, it never fails to serialize.
BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT fenceproxy_history_position()

-- commit_checked --
-- In the COMMIT message, just before the COMMIT: this transaction's own id, kept once
-- the COMMIT returned, so that a restore that loses it is found on the next transaction,
-- on any connection.
SELECT fenceproxy_history_position(); COMMIT
