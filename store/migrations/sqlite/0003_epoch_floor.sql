-- A floor under every epoch the store will issue. `fenceproxy store fence-restore`
-- raises it after a restore from backup, so no epoch issued since the backup (and
-- perhaps seen by the upstream) is ever issued again, for old and new resources alike.
CREATE TABLE store_meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch_floor INTEGER NOT NULL
);
INSERT INTO store_meta (id, epoch_floor) VALUES (1, 0);
