-- Probing and settling effects in doubt. Every decision about an effect (a probe
-- attempt, a restart's recovery, an operator's resolution) is an event row, so
-- `effects show` can tell who decided what, when and why.
ALTER TABLE effects ADD COLUMN probe_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE effects ADD COLUMN next_probe_at REAL;
ALTER TABLE effects ADD COLUMN probe_claimed_by TEXT;
ALTER TABLE effects ADD COLUMN probe_claimed_until REAL;
ALTER TABLE effects ADD COLUMN settled_by TEXT;

CREATE TABLE effect_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    effect_id TEXT NOT NULL REFERENCES effects (id),
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    actor TEXT NOT NULL,
    upstream_status INTEGER,
    conclusion TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX effect_events_by_effect ON effect_events (effect_id, id);

-- A committed effect settled by reconciliation has no response to replay; the
-- idempotency record says so instead.
ALTER TABLE idempotency ADD COLUMN settled_by TEXT;
