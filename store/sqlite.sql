-- All SQL of the SQLite backend, as named blocks loaded by store/queries.py.
-- Writes run inside BEGIN IMMEDIATE, which serialises writers on the file; the
-- PostgreSQL file takes row locks instead.

-- lock_resource --
-- Nothing to lock: BEGIN IMMEDIATE already serialises every writer on the file,
-- so this block is empty and costs nothing.

-- forget_unleased_resource --
-- After a refused acquire of a resource never leased (see the PostgreSQL file): here
-- lock_resource writes no row, so there is none to forget; the block is empty.

-- resource_state --
-- The highest epoch issued (NULL: never), with the lease granted at that epoch if it
-- was a grant (a revocation advances the epoch without one), the epoch floor, and
-- open_effects: the resource's unsettled effects, which block it (core/lifecycle.py
-- BLOCKING), in admission order, as a JSON array of [id, state, epoch, idempotency_key,
-- fingerprint]. admission_state's columns of the same names are these (store/rows.py
-- `resource_state` reads both).
SELECT :resource AS resource, r.epoch, m.epoch_floor,
       l.holder, l.granted_at, l.expires_at, l.ended_at, l.end_reason, l.client,
       (SELECT json_group_array(json_array(o.id, o.state, o.epoch, o.idempotency_key,
                                           o.fingerprint))
        FROM (SELECT id, state, epoch, idempotency_key, fingerprint FROM effects
              WHERE resource = :resource
                AND (state = 'DISPATCHING' OR state = 'UNKNOWN' OR state = 'CONFLICTING')
              ORDER BY created_at) AS o) AS open_effects
FROM store_meta m
LEFT JOIN resources r ON r.resource = :resource
LEFT JOIN leases l ON l.resource = r.resource AND l.epoch = r.epoch

-- lease_by_token --
SELECT resource, epoch, holder, granted_at, expires_at, ended_at, end_reason, client
FROM leases WHERE token_hash = :token_hash

-- set_resource_epoch --
INSERT INTO resources (resource, epoch) VALUES (:resource, :epoch)
ON CONFLICT (resource) DO UPDATE SET epoch = excluded.epoch

-- insert_lease --
INSERT INTO leases (resource, epoch, holder, token_hash, granted_at, expires_at, granted_ttl_s, client)
VALUES (:resource, :epoch, :holder, :token_hash, :granted_at, :expires_at, :ttl_s, :client)

-- extend_lease --
UPDATE leases SET expires_at = :expires_at, renewals = renewals + 1, last_ttl_s = :ttl_s
WHERE resource = :resource AND epoch = :epoch

-- mark_came_back --
-- Its holder presented the token after the lease expired: it was alive.
UPDATE leases SET came_back_at = :now
WHERE resource = :resource AND epoch = :epoch AND came_back_at IS NULL

-- lease_lives --
-- The leases granted since :since, newest first (leases_by_grant), for lease-advice.
SELECT resource, epoch, granted_at, expires_at, ended_at, end_reason, granted_ttl_s,
       renewals, came_back_at
FROM leases WHERE granted_at >= :since
ORDER BY granted_at DESC LIMIT :limit

-- route_latencies --
-- Admission to receipt of the effects created since :since whose own receipt settled
-- them (settled_by NULL: a probe or an operator rewrites finished_at), newest first
-- (effects_by_time). One the upstream timeout left UNKNOWN counts at its timeout
-- until a probe settles it.
SELECT route, finished_at - created_at AS seconds FROM effects
WHERE created_at >= :since AND finished_at IS NOT NULL AND settled_by IS NULL
ORDER BY created_at DESC LIMIT :limit

-- end_lease --
UPDATE leases SET ended_at = :ended_at, end_reason = :end_reason
WHERE resource = :resource AND epoch = :epoch AND ended_at IS NULL

-- lock_quota_subject --
-- Nothing to lock: BEGIN IMMEDIATE already serialises every acquire on the file, so
-- a subject's live leases cannot change between their count and the grant.

-- live_leases_of_holder --
-- A quota subject's live leases (quotas.live_leases) and when the first of them
-- expires; read through leases_live_by_holder, the subject's range of unended leases.
SELECT count(*) AS n, min(expires_at) AS earliest FROM leases
WHERE holder = :holder AND ended_at IS NULL AND expires_at > :now

-- live_leases_of_client --
-- With `auth:`, the quota subject is the client that took the leases, through
-- leases_live_by_client.
SELECT count(*) AS n, min(expires_at) AS earliest FROM leases
WHERE client = :client AND ended_at IS NULL AND expires_at > :now

-- idempotency_record --
SELECT i.resource, i.key, i.fingerprint, i.effect_id, e.state AS effect_state, i.epoch,
       i.expires_at, i.response_status, i.response_headers, i.response_body, i.settled_by
FROM idempotency i JOIN effects e ON e.id = i.effect_id
WHERE i.resource = :resource AND i.key = :key

-- commit_idempotency_key --
-- The operation took effect: from now on its key replays (the response, if one was
-- seen) for retain_s, whichever effect of the operation held the key before.
INSERT INTO idempotency (resource, key, fingerprint, effect_id, epoch, expires_at,
                         response_status, response_headers, response_body, settled_by)
VALUES (:resource, :key, :fingerprint, :effect_id, :epoch, :expires_at,
        :status, :headers, :body, :settled_by)
ON CONFLICT (resource, key) DO UPDATE SET
    fingerprint = excluded.fingerprint, effect_id = excluded.effect_id,
    epoch = excluded.epoch, expires_at = excluded.expires_at,
    -- A response this very effect's receipt kept (before a conflict) stays replayable.
    response_status = CASE WHEN idempotency.effect_id = excluded.effect_id
        THEN COALESCE(excluded.response_status, idempotency.response_status)
        ELSE excluded.response_status END,
    response_headers = CASE WHEN idempotency.effect_id = excluded.effect_id
        THEN COALESCE(excluded.response_headers, idempotency.response_headers)
        ELSE excluded.response_headers END,
    response_body = CASE WHEN idempotency.effect_id = excluded.effect_id
        THEN COALESCE(excluded.response_body, idempotency.response_body)
        ELSE excluded.response_body END,
    settled_by = excluded.settled_by

-- free_idempotency_key --
-- Only the effect's own record: a key another effect holds now is that effect's.
-- Only when no other effect under the key is open (else pass_idempotency_key).
DELETE FROM idempotency WHERE effect_id = :effect_id

-- open_effects_under_key --
-- The effects under one operation's key that are open (core/lifecycle.py BLOCKING),
-- in admission order: who may inherit the key (lifecycle.key_heir).
SELECT id, fingerprint, epoch FROM effects
WHERE resource = :resource AND idempotency_key = :key
  AND (state = 'DISPATCHING' OR state = 'UNKNOWN' OR state = 'CONFLICTING')
ORDER BY created_at, id

-- pass_idempotency_key --
-- The effect let its key go while another effect under it is still open (a resend on
-- its way, an earlier send in dispute): the record passes to that one, unsettled
-- (no expiry, nothing to replay), instead of being deleted. Only the effect's own
-- record, as free_idempotency_key.
UPDATE idempotency SET effect_id = :heir, fingerprint = :fingerprint, epoch = :epoch,
    expires_at = NULL, response_status = NULL, response_headers = NULL,
    response_body = NULL, settled_by = NULL
WHERE effect_id = :effect_id

-- hold_idempotency_key --
-- Contradicting evidence: a freed key is taken back (no expiry) until an operator
-- decides; a key another effect holds is left to that effect.
INSERT INTO idempotency (resource, key, fingerprint, effect_id, epoch, expires_at)
VALUES (:resource, :key, :fingerprint, :effect_id, :epoch, NULL)
ON CONFLICT (resource, key) DO NOTHING

-- transition_effect --
-- One step of core/lifecycle.py's table, guarded by the state it was decided on: the
-- store checks that exactly one row changed.
UPDATE effects SET state = :state, finished_at = :finished_at,
                   upstream_status = :upstream_status, reason = :reason,
                   settled_by = :settled_by, next_probe_at = :next_probe_at,
                   probe_claimed_by = NULL, probe_claimed_until = NULL
WHERE id = :id AND state = :expected

-- effect --
SELECT * FROM effects WHERE id = :id

-- effect_for_update --
SELECT * FROM effects WHERE id = :id

-- effect_for_update_skip_locked --
-- A sweep passes over an effect another transaction is changing (its receipt, another
-- replica's sweep): that one decides, and this sweep neither waits nor repeats it.
SELECT * FROM effects WHERE id = :id

-- effects --
-- The listings, newest first: each filter has its own query, so each reads one index
-- range (an `:x IS NULL OR` filter would make the planner walk everything).
SELECT * FROM effects ORDER BY created_at DESC LIMIT :limit

-- effects_of_resource --
-- The resource's history (bounded by retention), optionally in one state.
SELECT * FROM effects
WHERE resource = :resource AND (:state IS NULL OR state = :state)
ORDER BY created_at DESC LIMIT :limit

-- effects_in_state --
-- A settled state, from the partial index effects_settled.
SELECT * FROM effects
WHERE (state = 'COMMITTED' OR state = 'NOT_COMMITTED' OR state = 'NOT_SENT') AND state = :state
ORDER BY created_at DESC LIMIT :limit

-- in_doubt_effects_in_state --
-- A state in doubt: the partial index effects_open holds only those.
SELECT * FROM effects
WHERE (state = 'DISPATCHING' OR state = 'UNKNOWN' OR state = 'CONFLICTING') AND state = :state
ORDER BY created_at DESC LIMIT :limit

-- claim_refusal_batch --
-- Whether batch :seq of :flusher is new: recorded here, in the transaction that writes
-- its counts, so a batch retried after a cancelled flush is written once (0 rows: the
-- batch was written already).
INSERT INTO refusal_batches (flusher, seq, at) VALUES (:flusher, :seq, :now)
ON CONFLICT (flusher) DO UPDATE SET seq = excluded.seq, at = excluded.at
WHERE refusal_batches.seq < excluded.seq

-- add_refusals --
-- A batch's counts, :kinds a JSON array of {resource, code, route, epoch, holder,
-- client, n, method, path, fingerprint, i}, in one statement. A name is kept only if it
-- exists (the key stays bounded by what exists, whatever the requests say): the resource
-- if it is a row of resources, the epoch if that resource had a lease at it, the holder
-- if it held that lease; the client is the caller's, else that lease's. Kinds that come
-- to one key are summed first, so each row is written once a flush (the sample is the
-- kind with the highest i). min/max: a flush that started earlier can commit later
-- (another replica's); a row keeps spanning both times.
INSERT INTO refusals (resource, code, route, epoch, holder, client, count, first_seen,
                      last_seen, method, path, fingerprint)
SELECT resource, code, route, epoch, holder, client, n, :now, :now, method, path, fingerprint
FROM (
    -- One max() aggregate: the bare columns are those of the row with the highest i.
    SELECT resource, code, route, epoch, holder, client, sum(n) AS n, method, path,
           fingerprint, max(i)
    FROM (
        SELECT coalesce(r.resource, '') AS resource, k.code, k.route,
               CASE WHEN l.resource IS NULL THEN 0 ELSE l.epoch END AS epoch,
               CASE WHEN l.holder = k.holder THEN l.holder ELSE '' END AS holder,
               CASE WHEN k.client <> '' THEN k.client ELSE coalesce(l.client, '') END
                   AS client,
               k.n, k.method, k.path, k.fingerprint, k.i
        FROM (
            SELECT json_extract(value, '$.resource') AS resource,
                   json_extract(value, '$.code') AS code,
                   json_extract(value, '$.route') AS route,
                   json_extract(value, '$.epoch') AS epoch,
                   json_extract(value, '$.holder') AS holder,
                   json_extract(value, '$.client') AS client,
                   json_extract(value, '$.n') AS n,
                   json_extract(value, '$.method') AS method,
                   json_extract(value, '$.path') AS path,
                   json_extract(value, '$.fingerprint') AS fingerprint,
                   json_extract(value, '$.i') AS i
            FROM json_each(:kinds)
        ) AS k
        LEFT JOIN resources r ON r.resource = k.resource
        LEFT JOIN leases l ON l.resource = r.resource AND l.epoch = k.epoch
    )
    GROUP BY resource, code, route, epoch, holder, client
)
WHERE TRUE
ON CONFLICT (resource, code, route, epoch, holder, client) DO UPDATE SET
    count = refusals.count + excluded.count,
    first_seen = min(refusals.first_seen, excluded.first_seen),
    last_seen = max(refusals.last_seen, excluded.last_seen),
    method = excluded.method, path = excluded.path, fingerprint = excluded.fingerprint

-- refusals --
SELECT last_seen AS at, first_seen, count, code, method, path, route, resource, holder,
       epoch, client, fingerprint
FROM refusals
ORDER BY last_seen DESC LIMIT :limit

-- refusals_of_resource --
SELECT last_seen AS at, first_seen, count, code, method, path, route, resource, holder,
       epoch, client, fingerprint
FROM refusals WHERE resource = :resource
ORDER BY last_seen DESC LIMIT :limit

-- gc_lock --
SELECT 1 AS acquired

-- expired_idempotency_records --
-- Not while another effect under the key is open (a resend of the committed
-- operation still in doubt, a send in dispute): the key is that effect's to keep, and
-- goes when it settles.
DELETE FROM idempotency
WHERE expires_at IS NOT NULL AND expires_at <= :now
  AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.id = idempotency.effect_id
                  AND e.state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING'))
  AND NOT EXISTS (SELECT 1 FROM effects o WHERE o.resource = idempotency.resource
                  AND o.idempotency_key = idempotency.key
                  AND (o.state = 'DISPATCHING' OR o.state = 'UNKNOWN'
                       OR o.state = 'CONFLICTING'))

-- retention_lock --
-- BEGIN IMMEDIATE already makes this the only writer.
SELECT 1 AS acquired

-- expired_effects --
-- Settled effects that settled before the horizon and that no idempotency record still
-- retains (no expiry yet, one in the future, or a key an open effect under it still
-- needs: a resend of the operation in doubt). Read from effects_settled, the range
-- created before the horizon (which holds every effect settled before it): a pass never
-- looks at effects in doubt or recent. No ORDER BY: which old ones go first does not
-- matter, and without it no plan has to sort every candidate before the LIMIT.
SELECT id FROM effects
WHERE (state = 'COMMITTED' OR state = 'NOT_COMMITTED' OR state = 'NOT_SENT')
  AND created_at < :horizon AND finished_at < :horizon
  AND NOT EXISTS (SELECT 1 FROM idempotency i WHERE i.effect_id = effects.id
                  AND (i.expires_at IS NULL OR i.expires_at > :now
                       OR EXISTS (SELECT 1 FROM effects o
                                  WHERE o.resource = i.resource AND o.idempotency_key = i.key
                                    AND (o.state = 'DISPATCHING' OR o.state = 'UNKNOWN'
                                         OR o.state = 'CONFLICTING'))))
LIMIT :limit

-- delete_events_of_effects --
-- :ids is a JSON array of effect ids (one parameter on both backends).
DELETE FROM effect_events WHERE effect_id IN (SELECT value FROM json_each(:ids))

-- delete_keys_of_effects --
DELETE FROM idempotency WHERE effect_id IN (SELECT value FROM json_each(:ids))
  AND expires_at IS NOT NULL AND expires_at <= :now

-- delete_effects --
-- Whatever was picked, an effect in doubt is never deleted.
DELETE FROM effects WHERE id IN (SELECT value FROM json_each(:ids))
  AND state NOT IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING')

-- delete_expired_refusals --
-- Kinds not seen since the horizon, oldest first (from refusals_by_last_seen), at most
-- :limit a pass.
DELETE FROM refusals
WHERE (resource, code, route, epoch, holder, client) IN (
    SELECT resource, code, route, epoch, holder, client FROM refusals
    WHERE last_seen < :horizon ORDER BY last_seen LIMIT :limit)

-- delete_expired_refusal_batches --
-- A batch's mark matters only while a flush may retry it (seconds); one row a store
-- ever opened is dropped with the refusals of its time.
DELETE FROM refusal_batches WHERE at < :horizon

-- delete_expired_leases --
-- Leases that expired before the horizon: not one of them can be live again (a lease is
-- renewed only while live), whether it was released, revoked, superseded or let lapse.
-- From leases_by_expiry, at most :limit a pass.
DELETE FROM leases WHERE rowid IN (
    SELECT rowid FROM leases WHERE expires_at < :horizon LIMIT :limit)
RETURNING resource

-- lock_resources --
-- The resources of the leases a pass deleted (BEGIN IMMEDIATE holds them all already).
SELECT resource FROM resources WHERE resource IN (SELECT value FROM json_each(:resources))

-- sweep_resources --
-- The next :limit resource rows after where the last pass stopped, in key order.
SELECT resource FROM resources
WHERE resource > (SELECT resources_swept_to FROM store_meta)
ORDER BY resource LIMIT :limit

-- set_resources_swept_to --
UPDATE store_meta SET resources_swept_to = :resource

-- delete_unreferenced_resources --
-- Of the rows read above, those nothing refers to any more: no lease (live or kept for its
-- history), no effect (in doubt or settled). No idempotency record either: each has its
-- effect, of the same resource (a foreign key). Their epochs are returned for the floor.
DELETE FROM resources
WHERE resource IN (SELECT value FROM json_each(:resources))
  AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.resource = resources.resource)
  AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.resource = resources.resource)
RETURNING epoch

-- raise_epoch_floor --
-- Never lowered: the floor only grows.
UPDATE store_meta SET epoch_floor = :floor WHERE epoch_floor < :floor

-- ping --
SELECT 1 AS ok

-- dispatching_effects_of_instance --
SELECT id FROM effects WHERE state = 'DISPATCHING' AND instance_id = :instance_id

-- overdue_dispatching_effects --
SELECT id FROM effects WHERE state = 'DISPATCHING' AND deadline < :cutoff

-- insert_event --
INSERT INTO effect_events (effect_id, at, kind, actor, upstream_status, conclusion, detail)
VALUES (:effect_id, :at, :kind, :actor, :upstream_status, :conclusion, :detail)

-- effect_events --
SELECT at, kind, actor, upstream_status, conclusion, detail FROM effect_events
WHERE effect_id = :effect_id ORDER BY id

-- in_doubt_effects --
SELECT * FROM effects WHERE (state = 'DISPATCHING' OR state = 'UNKNOWN' OR state = 'CONFLICTING')
ORDER BY created_at LIMIT :limit

-- due_probes --
SELECT * FROM effects
WHERE state = 'UNKNOWN' AND next_probe_at IS NOT NULL AND next_probe_at <= :now
  AND (probe_claimed_until IS NULL OR probe_claimed_until < :now)
ORDER BY next_probe_at LIMIT :limit

-- claim_probe --
UPDATE effects SET probe_claimed_by = :instance_id, probe_claimed_until = :until
WHERE id = :id AND state = 'UNKNOWN'
  AND (probe_claimed_until IS NULL OR probe_claimed_until < :now)

-- record_probe_attempt --
-- An early "not committed" inside the settle window proves nothing and is not counted.
UPDATE effects SET probe_attempts = probe_attempts + :counted, next_probe_at = :next_probe_at,
                   probe_claimed_by = NULL, probe_claimed_until = NULL
WHERE id = :id AND state = 'UNKNOWN'

-- count_in_doubt_effects_by_state --
-- Only the states in doubt, from the partial index effects_open: a scrape never
-- counts the settled history (the settled are counted as they settle, in memory).
SELECT state, count(*) AS n FROM effects
WHERE (state = 'DISPATCHING' OR state = 'UNKNOWN' OR state = 'CONFLICTING') GROUP BY state

-- blocked_resources --
-- Resources waiting for reconciliation (a request merely in flight is not counted).
-- Spelled so that it matches the partial index effects_open's predicate.
SELECT count(DISTINCT resource) AS n FROM effects
WHERE (state = 'DISPATCHING' OR state = 'UNKNOWN' OR state = 'CONFLICTING') AND state <> 'DISPATCHING'

-- oldest_in_doubt --
SELECT min(created_at) AS oldest FROM effects
WHERE (state = 'DISPATCHING' OR state = 'UNKNOWN' OR state = 'CONFLICTING')

-- lock_all_resources --
-- Nothing to lock: BEGIN IMMEDIATE already serialises every acquire on the file, so no
-- epoch can rise between fence-restore's read of the highest and its write.

-- epoch_floor_and_max --
SELECT m.epoch_floor, (SELECT COALESCE(MAX(epoch), 0) FROM resources) AS max_epoch
FROM store_meta m

-- set_epoch_floor --
UPDATE store_meta SET epoch_floor = :floor

-- advance_all_epochs --
UPDATE resources SET epoch = max(epoch, :floor)

-- end_all_leases --
UPDATE leases SET ended_at = :now, end_reason = :reason WHERE ended_at IS NULL

-- store_identity --
SELECT store_id, created_at, fenced_at FROM store_identity

-- mark_fenced --
UPDATE store_identity SET fenced_at = :now

-- heartbeat --
-- A write that proves the store takes writes (readyz); one row per instance.
INSERT INTO heartbeats (instance_id, at) VALUES (:instance_id, :now)
ON CONFLICT (instance_id) DO UPDATE SET at = excluded.at

-- record_replica --
-- The status page's view of this instance, from the reconciler's loop.
INSERT INTO replicas (instance_id, version, started_at, seen_at, last_sweep_at, last_probe_at,
                      policy_digest, oldest_peer)
VALUES (:instance_id, :version, :started_at, :now, :last_sweep_at, :last_probe_at,
        :policy_digest, :oldest_peer)
ON CONFLICT (instance_id) DO UPDATE SET
    version = excluded.version, started_at = excluded.started_at, seen_at = excluded.seen_at,
    last_sweep_at = excluded.last_sweep_at, last_probe_at = excluded.last_probe_at,
    policy_digest = excluded.policy_digest, oldest_peer = excluded.oldest_peer

-- replicas_seen --
-- The instances that wrote their row since :since (replicas_by_seen), latest first.
SELECT instance_id, version, started_at, seen_at, last_sweep_at, last_probe_at, policy_digest
FROM replicas WHERE seen_at >= :since ORDER BY seen_at DESC LIMIT :limit

-- forget_replica --
-- A replica refused at its start (core/releases.py) does not run: its row goes.
DELETE FROM replicas WHERE instance_id = :instance_id

-- replicas_running --
-- The other instances that wrote their row since :since: the peers a starting replica
-- must be able to serve beside (core/releases.py).
SELECT instance_id, version, oldest_peer FROM replicas
WHERE seen_at >= :since AND instance_id <> :instance_id ORDER BY instance_id

-- schema_contractions --
-- The applied migrations that declared the oldest release able to use the schema.
SELECT version, name, oldest_release FROM schema_contractions

-- replicas_seen_during_migration --
-- The other instances that wrote their row in the last :window_s seconds, read while
-- the schema changes (store/schema.py: a contraction waits for the older ones to go).
SELECT instance_id, version, oldest_peer FROM replicas
WHERE seen_at >= :now - :window_s AND instance_id IS NOT :instance_id
ORDER BY instance_id

-- record_contraction --
-- A migration that declared the oldest release able to use the schema after it.
INSERT INTO schema_contractions (version, name, oldest_release)
VALUES (:version, :name, :oldest_release)

-- unended_leases --
-- Leases nobody ended yet (live, or expired and not yet taken over), soonest expiry
-- last; at most one per resource.
SELECT resource, epoch, holder, client, granted_at, expires_at, ended_at, end_reason,
       came_back_at
FROM leases WHERE ended_at IS NULL ORDER BY expires_at DESC LIMIT :limit

-- leases_ended_since --
-- Leases granted since :since (leases_by_grant) that have expired or ended by :now.
SELECT resource, epoch, holder, client, granted_at, expires_at, ended_at, end_reason,
       came_back_at
FROM leases WHERE granted_at >= :since AND (ended_at IS NOT NULL OR expires_at <= :now)
ORDER BY granted_at DESC LIMIT :limit

-- admission_state --
-- Everything an admission decides on, in one statement (the file's write lock is
-- already held): columns t_* are the token's lease, then resource_state's (its
-- open_effects included), i_* the key's record: store/reads.py `admission_records`.
-- The time and the store id are the connector's own here (NULL).
SELECT NULL AS now, NULL AS store_id,
       t.resource AS t_resource, t.epoch AS t_epoch, t.holder AS t_holder,
       t.granted_at AS t_granted_at, t.expires_at AS t_expires_at, t.ended_at AS t_ended_at,
       t.end_reason AS t_end_reason, t.client AS t_client,
       r.epoch, m.epoch_floor, l.holder, l.granted_at, l.expires_at, l.ended_at,
       l.end_reason, l.client,
       (SELECT json_group_array(json_array(o.id, o.state, o.epoch, o.idempotency_key,
                                           o.fingerprint))
        FROM (SELECT id, state, epoch, idempotency_key, fingerprint FROM effects
              WHERE resource = :resource
                AND (state = 'DISPATCHING' OR state = 'UNKNOWN' OR state = 'CONFLICTING')
              ORDER BY created_at) AS o) AS open_effects,
       i.fingerprint AS i_fingerprint, i.effect_id AS i_effect_id, e.state AS i_effect_state,
       i.epoch AS i_epoch, i.expires_at AS i_expires_at,
       i.response_status AS i_response_status, i.response_headers AS i_response_headers,
       i.response_body AS i_response_body, i.settled_by AS i_settled_by
FROM store_meta m
LEFT JOIN leases t ON t.token_hash = :token_hash
LEFT JOIN resources r ON r.resource = :resource
LEFT JOIN leases l ON l.resource = r.resource AND l.epoch = r.epoch
LEFT JOIN idempotency i ON i.resource = :resource AND i.key = :key
LEFT JOIN effects e ON e.id = i.effect_id

-- admit_effect --
-- The admitted effect and, unless :claim is false, its key's claim (no expiry while
-- the effect is unsettled: retention runs from settlement). Two statements, run in
-- order in the one transaction.
INSERT INTO effects (id, route, resource, holder, epoch, idempotency_key, fingerprint,
                     method, path, state, instance_id, created_at, deadline, retain_s)
VALUES (:id, :route, :resource, :holder, :epoch, :idempotency_key, :fingerprint,
        :method, :path, 'DISPATCHING', :instance_id, :created_at, :deadline, :retain_s);
INSERT INTO idempotency (resource, key, fingerprint, effect_id, epoch, expires_at)
SELECT :resource, :idempotency_key, :fingerprint, :id, :epoch, NULL
WHERE :claim
ON CONFLICT (resource, key) DO UPDATE SET
    fingerprint = excluded.fingerprint, effect_id = excluded.effect_id,
    epoch = excluded.epoch, expires_at = NULL,
    response_status = NULL, response_headers = NULL, response_body = NULL, settled_by = NULL

-- receipt --
-- A receipt's plan written in one block (store/steps.py `write_in_one_statement`), as
-- PostgreSQL's fenceproxy_receipt writes it: no row read, no record rebuilt; what the
-- steps would write (tests/integration/app/test_receipt_paths.py compares the two). The connector runs the first statement and the rest only if
-- it changed the effect (else nothing was written: the effect had moved on, or the key
-- it would free is still needed by another open effect under it); :now is the
-- transaction's time.
UPDATE effects SET state = :state, finished_at = :now,
                   upstream_status = :upstream_status, reason = :reason,
                   settled_by = NULL,
                   next_probe_at = CASE WHEN :probe_now THEN :now END,
                   probe_claimed_by = NULL, probe_claimed_until = NULL
WHERE id = :id AND state = :expected
  AND NOT (:key_action = 'free' AND EXISTS (
      SELECT 1 FROM effects o
      WHERE o.resource = :resource AND o.idempotency_key = :idempotency_key
        AND o.id <> :id AND o.state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING')));
DELETE FROM idempotency WHERE :key_action = 'free' AND effect_id = :id;
INSERT INTO idempotency (resource, key, fingerprint, effect_id, epoch, expires_at,
                         response_status, response_headers, response_body, settled_by)
SELECT :resource, :idempotency_key, :fingerprint, :id, :epoch,
       :now + COALESCE((SELECT retain_s FROM effects WHERE id = :id), :default_retain_s),
       :status, :headers, :body, :key_settled_by
WHERE :key_action = 'commit'
-- As commit_idempotency_key: a response this very effect's receipt kept stays.
ON CONFLICT (resource, key) DO UPDATE SET
    fingerprint = excluded.fingerprint, effect_id = excluded.effect_id,
    epoch = excluded.epoch, expires_at = excluded.expires_at,
    response_status = CASE WHEN idempotency.effect_id = excluded.effect_id
        THEN COALESCE(excluded.response_status, idempotency.response_status)
        ELSE excluded.response_status END,
    response_headers = CASE WHEN idempotency.effect_id = excluded.effect_id
        THEN COALESCE(excluded.response_headers, idempotency.response_headers)
        ELSE excluded.response_headers END,
    response_body = CASE WHEN idempotency.effect_id = excluded.effect_id
        THEN COALESCE(excluded.response_body, idempotency.response_body)
        ELSE excluded.response_body END,
    settled_by = excluded.settled_by;
INSERT INTO effect_events (effect_id, at, kind, actor, upstream_status, conclusion, detail)
SELECT :id, :now, :kind, :actor, :upstream_status, :conclusion, :reason
WHERE :conclusion IS NOT NULL;

-- recovery_window --
-- The recovery window (see postgres.sql): never opened on SQLite, which has no standby.
SELECT recovery_opened_at, recovery_reason, NULL AS standbys, NULL AS sync_states,
    NULL AS synchronous_standby_names, NULL AS synchronous_commit
FROM store_meta

-- close_recovery_window --
UPDATE store_meta SET recovery_opened_at = NULL, recovery_reason = NULL
WHERE recovery_opened_at IS NOT NULL


-- lock_migrations --
-- Nothing to lock: the schema changes in a write transaction (BEGIN IMMEDIATE), which
-- serialises every writer on the file.

-- create_schema_migrations --
CREATE TABLE IF NOT EXISTS schema_migrations
    (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)

-- applied_migrations --
SELECT version FROM schema_migrations

-- record_migration --
INSERT INTO schema_migrations VALUES (:version, :name, :now)
