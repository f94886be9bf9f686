-- A failover to an asynchronous standby must not go unnoticed.
-- * history_timeline: the PostgreSQL timeline this store last wrote on (NULL until a
--   replica first checked it). A promoted standby, or a point-in-time restore, starts
--   a new timeline: the history after its branch point may be lost (store/history.py).
-- * recovery_opened_at / recovery_reason: the recovery window opened when lost history
--   was detected; while open, an idempotency key the store does not know is unknown,
--   not new. Closed (NULL) by an operator: `fenceproxy store close-recovery`.
ALTER TABLE store_meta ADD COLUMN history_timeline BIGINT;
ALTER TABLE store_meta ADD COLUMN recovery_opened_at DOUBLE PRECISION;
ALTER TABLE store_meta ADD COLUMN recovery_reason TEXT;
