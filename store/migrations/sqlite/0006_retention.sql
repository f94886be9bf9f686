-- Retention of the audit trail (policy `retention:`) and listings that do not grow
-- with it. Every background pass, listing and metrics query reads a bounded range of
-- an index, never the whole effects or rejections table:
-- * effects_settled: the settled effects of each state by creation. The collector
--   reads those created before its horizon (an effect settles after it is created,
--   so that range holds every one that settled before the horizon); `effects
--   --state COMMITTED` lists from it newest first. The states in doubt have
--   effects_open already.
-- * effects_by_time: `effects` newest first, whatever the state.
-- * rejections_by_time: the collector reads the rejections older than its horizon.
CREATE INDEX effects_settled ON effects (state, created_at)
    WHERE state IN ('COMMITTED', 'NOT_COMMITTED', 'NOT_SENT');
CREATE INDEX effects_by_time ON effects (created_at);
CREATE INDEX rejections_by_time ON rejections (at);
