-- An admission reads a resource's in-doubt effects in creation order; the
-- reconciler reads DISPATCHING effects past their deadline. Keep both to the few
-- rows in doubt, whatever the size of the effects table.
DROP INDEX effects_in_doubt;
CREATE INDEX effects_in_doubt ON effects (resource, created_at)
    WHERE state IN ('DISPATCHING', 'UNKNOWN');
CREATE INDEX effects_dispatching ON effects (deadline) WHERE state = 'DISPATCHING';
