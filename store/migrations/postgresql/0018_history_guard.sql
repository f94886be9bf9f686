-- Every transaction checks the database's history, not only each new connection: a pool
-- connection opened to a standby, kept, and used after the standby was promoted, an
-- old primary reached again, or a database restored in place behind a pooler's open
-- connections, all reach a server whose history is not the one the store last saw.
--
-- fenceproxy_history_position(): where this server's history is, told to the client as
-- a NOTICE ('fenceproxy history <walfile> <flushed lsn> <inserted lsn> <next xid> <own
-- xid>'), so that it rides on the BEGIN and COMMIT messages the transaction sends anyway
-- (a simple-query message returns no rows but does deliver notices): no round trip of
-- its own. The client judges it (store/history.py) before it sends the transaction's
-- first statement. On a standby in recovery the WAL functions raise (55000): nothing
-- runs there.
-- * The WAL position: the inserted one is judged (a server that holds less than was
--   seen went back), the flushed one kept (a crash loses WAL inserted but not flushed,
--   which no client was told was committed: no loss of history). Bytes, which a
--   restarted server also writes (its end-of-recovery checkpoint, full pages after it):
--   a restore can land past the position seen.
-- * Transaction ids, which only writes consume: just before its COMMIT a transaction
--   tells its own (0: it wrote nothing), kept once the COMMIT returned (durable with
--   synchronous_commit on, so never issued again after a crash); a server whose next
--   one is not past it lost that commit.
-- client_min_messages is set for the call only: a role that hides notices still hears.
CREATE FUNCTION fenceproxy_history_position() RETURNS void
LANGUAGE plpgsql VOLATILE
SET client_min_messages = notice
AS $$
DECLARE
    v_flushed pg_lsn := pg_current_wal_flush_lsn();
BEGIN
    RAISE NOTICE 'fenceproxy history % % % % %', pg_walfile_name(v_flushed), v_flushed,
        pg_current_wal_insert_lsn(), pg_snapshot_xmax(pg_current_snapshot()),
        COALESCE(pg_current_xact_id_if_assigned()::text, '0');
END
$$;

-- The server (its timeline and its postmaster's start) a recovery was made on: a
-- replica that finds a loss recovers it unless one was made on this very server since
-- it last changed (a restore or an old primary coming back is a restart; a promotion a
-- new timeline). Whether a recovery window is open does not matter: a restore can bring
-- back a window opened before its snapshot, with the floors of that time.
ALTER TABLE store_meta ADD COLUMN history_server_started DOUBLE PRECISION;
