-- The recovery window after lost history (see the PostgreSQL migration
-- 0015). A SQLite store has no standby and never opens one itself; the columns keep
-- the two schemas answering the same queries.
ALTER TABLE store_meta ADD COLUMN recovery_opened_at REAL;
ALTER TABLE store_meta ADD COLUMN recovery_reason TEXT;
