-- The effect lifecycle (core/lifecycle.py): a CONFLICTING state, and idempotency
-- retention that runs from settlement. A key whose effect is not settled has no
-- expiry (expires_at NULL); a settled one is kept for its route's retain_s from the
-- moment it settled, which the effect remembers from its admission.
ALTER TABLE effects ADD COLUMN retain_s REAL;

CREATE TABLE idempotency_new (
    resource TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    effect_id TEXT NOT NULL REFERENCES effects (id),
    epoch INTEGER NOT NULL,
    expires_at REAL,
    response_status INTEGER,
    response_headers TEXT,
    response_body BLOB,
    settled_by TEXT,
    PRIMARY KEY (resource, key)
);
INSERT INTO idempotency_new
SELECT i.resource, i.key, i.fingerprint, i.effect_id, i.epoch,
       CASE WHEN e.state IN ('DISPATCHING', 'UNKNOWN') THEN NULL ELSE i.expires_at END,
       i.response_status, i.response_headers, i.response_body, i.settled_by
FROM idempotency i JOIN effects e ON e.id = i.effect_id;
DROP TABLE idempotency;
ALTER TABLE idempotency_new RENAME TO idempotency;
CREATE INDEX idempotency_expiry ON idempotency (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX idempotency_by_effect ON idempotency (effect_id);

-- Unsettled effects (DISPATCHING, UNKNOWN, CONFLICTING) block their resource.
DROP INDEX effects_in_doubt;
CREATE INDEX effects_in_doubt ON effects (resource, created_at)
    WHERE state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING');
CREATE INDEX effects_open ON effects (created_at)
    WHERE state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING');
