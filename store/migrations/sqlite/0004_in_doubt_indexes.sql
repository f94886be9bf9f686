-- Lookups on the hot and background paths must not grow with the effects table:
-- an admission reads a resource's in-doubt effects in creation order, the
-- reconciler reads UNKNOWN effects due for a probe and DISPATCHING ones past
-- their deadline. Partial indexes keep each to the few rows in doubt.
DROP INDEX effects_in_doubt;
CREATE INDEX effects_in_doubt ON effects (resource, created_at)
    WHERE state IN ('DISPATCHING', 'UNKNOWN');
CREATE INDEX effects_due_probes ON effects (next_probe_at) WHERE state = 'UNKNOWN';
CREATE INDEX effects_dispatching ON effects (deadline) WHERE state = 'DISPATCHING';
