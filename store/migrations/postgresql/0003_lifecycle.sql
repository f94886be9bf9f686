-- The effect lifecycle (core/lifecycle.py): a CONFLICTING state, and idempotency
-- retention that runs from settlement. A key whose effect is not settled has no
-- expiry (expires_at NULL); a settled one is kept for its route's retain_s from the
-- moment it settled, which the effect remembers from its admission.
ALTER TABLE effects ADD COLUMN retain_s DOUBLE PRECISION;
ALTER TABLE idempotency ALTER COLUMN expires_at DROP NOT NULL;
UPDATE idempotency i SET expires_at = NULL
FROM effects e WHERE e.id = i.effect_id AND e.state IN ('DISPATCHING', 'UNKNOWN');
DROP INDEX idempotency_expiry;
CREATE INDEX idempotency_expiry ON idempotency (expires_at) WHERE expires_at IS NOT NULL;

-- Unsettled effects (DISPATCHING, UNKNOWN, CONFLICTING) block their resource.
DROP INDEX effects_in_doubt;
CREATE INDEX effects_in_doubt ON effects (resource, created_at)
    WHERE state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING');
CREATE INDEX effects_open ON effects (created_at)
    WHERE state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING');
