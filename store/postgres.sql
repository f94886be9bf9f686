-- All SQL of the PostgreSQL backend, as named blocks loaded by store/queries.py.
-- Every decision about a resource first takes its row lock (lock_resource), so
-- replicas sharing the database decide one at a time per resource; the query
-- names and results are the SQLite file's.

-- lock_resource --
-- Upserting takes the resource row's lock (a row with epoch 0 for a resource never
-- leased), so every decision about one resource runs one replica at a time.
-- WHERE FALSE: the row is locked, not updated. An update would leave a row version per
-- decision (refused ones included: 10^5 refused renews grew resources by 3 MB until a
-- vacuum). The lock may have been waited for: the decision is judged at the time it is
-- held, so the time is read once the upsert has run (the aggregate waits for it).
WITH locked AS (
    INSERT INTO resources AS r (resource, epoch) VALUES (:resource, 0)
    ON CONFLICT (resource) DO UPDATE SET epoch = r.epoch WHERE FALSE
    RETURNING 1
)
SELECT extract(epoch FROM clock_timestamp())::float8
       + (SELECT clock_offset_s FROM store_meta) AS now
FROM (SELECT count(*) FROM locked) AS held

-- forget_unleased_resource --
-- After a refused acquire of a resource never leased: the epoch-0 row lock_resource
-- inserted to lock it goes with the refusal, so a made-up name leaves no row (nor a
-- refusal that keeps it: add_refusals keeps only names of resources). Only a row nothing
-- refers to, at epoch 0: an epoch issued is never forgotten here.
DELETE FROM resources r
WHERE r.resource = :resource AND r.epoch = 0
  AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.resource = r.resource)
  AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.resource = r.resource)

-- resource_state --
-- The highest epoch issued (0 or NULL: never), with the lease granted at that epoch
-- if it was a grant, the epoch floor, and open_effects: the resource's unsettled
-- effects, which block it (core/lifecycle.py BLOCKING), in admission order, as a JSON
-- array of [id, state, epoch, idempotency_key, fingerprint]. The columns of the same
-- names that fenceproxy_admission_state answers are these (store/rows.py
-- `resource_state` reads both).
SELECT :resource::text AS resource, r.epoch, m.epoch_floor,
       l.holder, l.granted_at, l.expires_at, l.ended_at, l.end_reason, l.client,
       (SELECT COALESCE(json_agg(json_build_array(o.id, o.state, o.epoch,
                                                  o.idempotency_key, o.fingerprint)
                                 ORDER BY o.created_at), '[]')::text
        FROM effects o
        WHERE o.resource = :resource::text
          AND o.state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING')) AS open_effects
FROM store_meta m
LEFT JOIN resources r ON r.resource = :resource::text
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
-- Taken by an acquire whose subject's live leases are capped, after the resource's
-- lock (always in that order, so two acquires never wait on each other crosswise):
-- acquires of one subject on different resources, through any replica, count its
-- live leases one at a time, so the cap holds exactly. A transaction-level advisory
-- lock on (a namespace, the subject's hash): two subjects that share a hash only
-- wait for each other. The next statement's snapshot sees what the lock's previous
-- holder committed (READ COMMITTED); it may have been waited for, hence the time.
SELECT pg_advisory_xact_lock(7431010, hashtext(:subject)) AS locked,
       extract(epoch FROM clock_timestamp())::float8
       + (SELECT clock_offset_s FROM store_meta) AS now

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
-- seen) for retain_s, whichever effect of the operation held the key before. The same
-- statement as the one-statement receipt's (migration 0022 spells it inside the receipt
-- too; tests/integration/app/test_lifecycle_store.py runs both paths).
SELECT fenceproxy_commit_key(:resource, :key, :fingerprint, :effect_id, :epoch, :expires_at,
                             :status, :headers, :body, :settled_by)

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
WHERE id = :id AND state = :expected::text

-- effect --
SELECT * FROM effects WHERE id = :id

-- effect_for_update --
SELECT * FROM effects WHERE id = :id FOR UPDATE

-- effect_for_update_skip_locked --
-- A sweep passes over an effect another transaction is changing (its receipt, another
-- replica's sweep): that one decides, and this sweep neither waits nor repeats it.
SELECT * FROM effects WHERE id = :id FOR UPDATE SKIP LOCKED

-- effects --
-- The listings, newest first: each filter has its own query, so each reads one index
-- range (an `:x IS NULL OR` filter would make the planner walk everything).
SELECT * FROM effects ORDER BY created_at DESC LIMIT :limit

-- effects_of_resource --
-- The resource's history (bounded by retention), optionally in one state.
SELECT * FROM effects
WHERE resource = :resource AND (:state::text IS NULL OR state = :state::text)
ORDER BY created_at DESC LIMIT :limit

-- effects_in_state --
-- A settled state, from the partial index effects_settled.
SELECT * FROM effects
WHERE state IN ('COMMITTED', 'NOT_COMMITTED', 'NOT_SENT') AND state = :state
ORDER BY created_at DESC LIMIT :limit

-- in_doubt_effects_in_state --
-- A state in doubt: the partial index effects_in_doubt holds only those (all of it is
-- read, then sorted: it is small).
SELECT * FROM effects
WHERE state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING') AND state = :state
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
-- to one key are summed first, so each row is written once a flush (one row version
-- each, not one per kind), with the sample of the kind with the highest i; in the key's
-- order, so that two replicas' flushes lock rows in one order and never deadlock.
-- least/greatest: a flush that started earlier can commit later (another replica's);
-- a row keeps spanning both times.
INSERT INTO refusals (resource, code, route, epoch, holder, client, count, first_seen,
                      last_seen, method, path, fingerprint)
SELECT resource, code, route, epoch, holder, client, sum(n), :now::float8, :now::float8,
       (array_agg(method ORDER BY i DESC))[1], (array_agg(path ORDER BY i DESC))[1],
       (array_agg(fingerprint ORDER BY i DESC))[1]
FROM (
    SELECT coalesce(r.resource, '') AS resource, k.code, k.route,
           CASE WHEN l.resource IS NULL THEN 0 ELSE l.epoch END AS epoch,
           CASE WHEN l.holder = k.holder THEN l.holder ELSE '' END AS holder,
           CASE WHEN k.client <> '' THEN k.client ELSE coalesce(l.client, '') END AS client,
           k.n, k.method, k.path, k.fingerprint, k.i
    FROM jsonb_to_recordset(:kinds::jsonb) AS k(
        resource text, code text, route text, epoch bigint, holder text, client text,
        n bigint, method text, path text, fingerprint text, i bigint)
    LEFT JOIN resources r ON r.resource = k.resource
    LEFT JOIN leases l ON l.resource = r.resource AND l.epoch = k.epoch
) AS kinds
GROUP BY resource, code, route, epoch, holder, client
ORDER BY resource, code, route, epoch, holder, client
ON CONFLICT (resource, code, route, epoch, holder, client) DO UPDATE SET
    count = refusals.count + excluded.count,
    first_seen = least(refusals.first_seen, excluded.first_seen),
    last_seen = greatest(refusals.last_seen, excluded.last_seen),
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
-- One replica at a time collects garbage; the others skip this round.
SELECT pg_try_advisory_xact_lock(7431001) AS acquired

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
                  AND o.state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING'))

-- retention_lock --
-- One replica at a time applies retention; the others skip this pass.
SELECT pg_try_advisory_xact_lock(7431002) AS acquired

-- expired_effects --
-- Settled effects that settled before the horizon and that no idempotency record still
-- retains (no expiry yet, one in the future, or a key an open effect under it still
-- needs: a resend of the operation in doubt). Read from effects_settled, the range
-- created before the horizon (which holds every effect settled before it): a pass never
-- looks at effects in doubt or recent. No ORDER BY: which old ones go first does not
-- matter, and without it no plan has to sort every candidate before the LIMIT.
-- Locked until the pass commits (SKIP LOCKED: never waits on one being settled);
-- a row that changed state meanwhile is re-checked and left out.
SELECT id FROM effects
WHERE state IN ('COMMITTED', 'NOT_COMMITTED', 'NOT_SENT')
  AND created_at < :horizon AND finished_at < :horizon
  AND NOT EXISTS (SELECT 1 FROM idempotency i WHERE i.effect_id = effects.id
                  AND (i.expires_at IS NULL OR i.expires_at > :now
                       OR EXISTS (SELECT 1 FROM effects o
                                  WHERE o.resource = i.resource AND o.idempotency_key = i.key
                                    AND o.state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING'))))
LIMIT :limit
FOR UPDATE OF effects SKIP LOCKED

-- delete_events_of_effects --
-- :ids is a JSON array of effect ids (one parameter on both backends), unpacked once
-- into an array so that the lookup is an index search, whatever the planner estimates.
DELETE FROM effect_events
WHERE effect_id = ANY (ARRAY(SELECT jsonb_array_elements_text(:ids::jsonb)))

-- delete_keys_of_effects --
DELETE FROM idempotency
WHERE effect_id = ANY (ARRAY(SELECT jsonb_array_elements_text(:ids::jsonb)))
  AND expires_at IS NOT NULL AND expires_at <= :now

-- delete_effects --
-- Whatever was picked, an effect in doubt is never deleted. (Spelled so that the planner
-- does not also read effects_settled for it: the ids are the whole search.)
DELETE FROM effects
WHERE id = ANY (ARRAY(SELECT jsonb_array_elements_text(:ids::jsonb)))
  AND state NOT IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING')

-- delete_expired_refusals --
-- Kinds not seen since the horizon, oldest first (from refusals_by_last_seen), at most
-- :limit a pass.
-- By ctid, as one array: looked up, where a key IN subquery may be hash-joined against
-- the whole table.
DELETE FROM refusals
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM refusals WHERE last_seen < :horizon ORDER BY last_seen LIMIT :limit))

-- delete_expired_refusal_batches --
-- A batch's mark matters only while a flush may retry it (seconds); one row a store
-- ever opened is dropped with the refusals of its time.
DELETE FROM refusal_batches WHERE at < :horizon

-- delete_expired_leases --
-- Leases that expired before the horizon: not one of them can be live again (a lease is
-- renewed only while live), whether it was released, revoked, superseded or let lapse.
-- From leases_by_expiry, at most :limit a pass; SKIP LOCKED: a lease another
-- transaction is ending is left for the next pass.
DELETE FROM leases
WHERE token_hash = ANY (ARRAY(
    SELECT token_hash FROM leases WHERE expires_at < :horizon LIMIT :limit
    FOR UPDATE SKIP LOCKED))
  AND expires_at < :horizon
RETURNING resource

-- lock_resources --
-- The resources of the leases a pass deleted, locked as every decision about a resource
-- locks it (see sweep_resources).
SELECT resource FROM resources
WHERE resource = ANY (ARRAY(SELECT jsonb_array_elements_text(:resources::jsonb)))
ORDER BY resource
FOR UPDATE OF resources SKIP LOCKED

-- sweep_resources --
-- The next :limit resource rows after where the last pass stopped, in key order, each
-- locked as every decision about a resource locks it, so that nothing about them changes
-- until the pass commits. SKIP LOCKED: a resource being decided on is in use; the next
-- round of the sweep sees it again.
SELECT resource FROM resources
WHERE resource > (SELECT resources_swept_to FROM store_meta)
ORDER BY resource LIMIT :limit
FOR UPDATE OF resources SKIP LOCKED

-- set_resources_swept_to --
UPDATE store_meta SET resources_swept_to = :resource

-- delete_unreferenced_resources --
-- Of the rows locked above, those nothing refers to any more: no lease (live or
-- kept for its history), no effect (in doubt or settled). No idempotency record
-- either: each has its effect, of the same resource (a foreign key). A
-- statement of its own after the lock, so that it reads everything committed before
-- the lock was taken (a lock's own recheck would not see other tables' new rows).
-- Their epochs are returned for the epoch floor.
DELETE FROM resources
WHERE resource = ANY (ARRAY(SELECT jsonb_array_elements_text(:resources::jsonb)))
  AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.resource = resources.resource)
  AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.resource = resources.resource)
RETURNING epoch

-- raise_epoch_floor --
-- Never lowered: the floor only grows.
UPDATE store_meta SET epoch_floor = :floor WHERE epoch_floor < :floor

-- ping --
SELECT 1 AS ok

-- dispatching_effects_of_instance --
-- Candidates only: each is then moved in its own transaction under its resource's lock.
SELECT id FROM effects WHERE state = 'DISPATCHING' AND instance_id = :instance_id

-- overdue_dispatching_effects --
-- Candidates only: each is then moved in its own transaction under its resource's lock.
SELECT id FROM effects WHERE state = 'DISPATCHING' AND deadline < :cutoff

-- insert_event --
INSERT INTO effect_events (effect_id, at, kind, actor, upstream_status, conclusion, detail)
VALUES (:effect_id, :at, :kind, :actor, :upstream_status, :conclusion, :detail)

-- effect_events --
SELECT at, kind, actor, upstream_status, conclusion, detail FROM effect_events
WHERE effect_id = :effect_id ORDER BY id

-- in_doubt_effects --
SELECT * FROM effects WHERE state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING')
ORDER BY created_at LIMIT :limit

-- due_probes --
-- SKIP LOCKED: replicas claiming at the same moment take different effects.
SELECT * FROM effects
WHERE state = 'UNKNOWN' AND next_probe_at IS NOT NULL AND next_probe_at <= :now
  AND (probe_claimed_until IS NULL OR probe_claimed_until < :now)
ORDER BY next_probe_at LIMIT :limit
FOR UPDATE SKIP LOCKED

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
-- Only the states in doubt, from the partial index effects_in_doubt: a scrape never
-- counts the settled history (the settled are counted as they settle, in memory).
SELECT state, count(*) AS n FROM effects
WHERE state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING') GROUP BY state

-- blocked_resources --
-- Resources waiting for reconciliation (a request merely in flight is not counted).
-- Spelled so that it matches the partial index effects_in_doubt's predicate.
SELECT count(DISTINCT resource) AS n FROM effects
WHERE state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING') AND state <> 'DISPATCHING'

-- oldest_in_doubt --
SELECT min(created_at) AS oldest FROM effects
WHERE state IN ('DISPATCHING', 'UNKNOWN', 'CONFLICTING')

-- lock_all_resources --
-- For fence-restore: the lock every acquire, revoke and admission waits for (they write
-- their resource's row first, lock_resource), on every resource at once, new ones
-- included; plain reads go on. No epoch can rise between the read of the highest and
-- the write above it, which would set that resource back under an epoch it issued.
LOCK TABLE resources IN EXCLUSIVE MODE

-- epoch_floor_and_max --
SELECT m.epoch_floor, (SELECT COALESCE(MAX(epoch), 0) FROM resources) AS max_epoch
FROM store_meta m

-- set_epoch_floor --
UPDATE store_meta SET epoch_floor = :floor

-- advance_all_epochs --
UPDATE resources SET epoch = GREATEST(epoch, :floor)

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
-- A schema transaction has no time of its own: the store's clock is read here.
SELECT instance_id, version, oldest_peer FROM replicas, store_meta m
WHERE seen_at >= extract(epoch FROM clock_timestamp())::float8 + m.clock_offset_s - :window_s
  AND instance_id IS DISTINCT FROM :instance_id::text
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
-- Everything an admission decides on, in one round trip, read once the resource's
-- row lock is held (see migration 0013 for why a function): columns t_* are the
-- token's lease, then resource_state's (its open_effects included), i_* the key's
-- record: store/reads.py `admission_records`.
-- Also the time once the lock was held, and the store id.
SELECT * FROM fenceproxy_admission_state(:token_hash, :resource, :key)

-- admit_effect --
-- The admitted effect and, unless :claim is false, its key's claim (no expiry while
-- the effect is unsettled: retention runs from settlement): one statement, one round
-- trip.
WITH effect AS (
    INSERT INTO effects (id, route, resource, holder, epoch, idempotency_key, fingerprint,
                         method, path, state, instance_id, created_at, deadline, retain_s)
    VALUES (:id, :route, :resource, :holder, :epoch, :idempotency_key, :fingerprint,
            :method, :path, 'DISPATCHING', :instance_id, :created_at, :deadline, :retain_s)
    RETURNING id
)
INSERT INTO idempotency (resource, key, fingerprint, effect_id, epoch, expires_at)
SELECT :resource, :idempotency_key, :fingerprint, effect.id, :epoch, NULL FROM effect
WHERE :claim::boolean
ON CONFLICT (resource, key) DO UPDATE SET
    fingerprint = excluded.fingerprint, effect_id = excluded.effect_id,
    epoch = excluded.epoch, expires_at = NULL,
    response_status = NULL, response_headers = NULL, response_body = NULL, settled_by = NULL

-- receipt --
-- A receipt's plan written as its own transaction in one statement (store/steps.py
-- `write_in_one_statement`; the function is migration 0020's): applied is false when
-- the effect had moved on, or its key is another open effect's now, and nothing was
-- written then. tests/integration/app/test_receipt_paths.py compares what it writes
-- with what the steps write.
SELECT * FROM fenceproxy_receipt(
    :store_id, :id, :resource, :expected, :state, :upstream_status, :reason, :probe_now,
    :key_action, :idempotency_key, :fingerprint, :epoch, :default_retain_s,
    :status, :headers, :body, :key_settled_by, :kind, :actor, :conclusion)

-- recovery_window --
-- The recovery window after lost history (store/history.py); NULL: closed.
-- And what the primary says of its standbys (any role sees their rows and the
-- settings; their sync_state needs pg_read_all_stats, else NULL).
SELECT m.recovery_opened_at, m.recovery_reason, r.standbys, r.sync_states,
    current_setting('synchronous_standby_names') AS synchronous_standby_names,
    current_setting('synchronous_commit') AS synchronous_commit
FROM store_meta m,
    (SELECT count(*) AS standbys, array_agg(sync_state::text) AS sync_states
     FROM pg_stat_replication) r

-- close_recovery_window --
UPDATE store_meta SET recovery_opened_at = NULL, recovery_reason = NULL
WHERE recovery_opened_at IS NOT NULL


-- lock_migrations --
-- One replica at a time changes the schema (store/schema.py): a transaction-level
-- advisory lock, since a lock that outlived its transaction would be held by whichever
-- client a pooler in transaction mode gives that server connection to next.
SELECT pg_advisory_xact_lock(7431000)

-- create_schema_migrations --
CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY,
    name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())

-- applied_migrations --
SELECT version FROM schema_migrations

-- record_migration --
INSERT INTO schema_migrations (version, name) VALUES (:version, :name)
