"""The fencing rules, one test per rule, on plain records with an explicit `now`.

Each test is built so that it fails if the rule it names is removed or moved in the
order of checks (route → token/resource → epoch current → not expired → not blocked →
idempotency → in-flight limit → lease covers upstream timeout).
"""

from __future__ import annotations

import json

from core.codes import ErrorCode
from core.fencing import (
    NO_AUTH,
    AdmissionRequest,
    Admit,
    Grant,
    Replay,
    check_lease,
    decide_acquire,
    decide_admission,
    decide_release,
    decide_renew,
    holder_came_back,
)
from core.records import (
    EffectState,
    IdempotencyRecord,
    LeaseRecord,
    OpenEffect,
    Refusal,
    ResourceState,
    StoredResponse,
)
from proxy.problems import refusal_response

NOW = 1_000_000.0
RESOURCE = "supplier:widget"
TTL = 30.0
TIMEOUT = 5.0


def lease(
    epoch: int = 3,
    expires_at: float = NOW + 60,
    ended_at: float | None = None,
    end_reason: str | None = None,
    resource: str = RESOURCE,
    holder: str = "worker-1",
) -> LeaseRecord:
    return LeaseRecord(
        resource=resource,
        epoch=epoch,
        holder=holder,
        granted_at=expires_at - 60,
        expires_at=expires_at,
        ended_at=ended_at,
        end_reason=end_reason,
    )


def state(
    current: LeaseRecord | None,
    epoch: int | None = None,
    unknown: tuple[str, ...] = (),
    dispatching: tuple[str, ...] = (),
    resource: str = RESOURCE,
    unknown_operations: tuple[tuple[str | None, str], ...] = (),
) -> ResourceState:
    """A resource whose highest epoch is `epoch` (default: the lease's) with `current` at it."""
    if epoch is None:
        epoch = current.epoch if current is not None else 0
    # An UNKNOWN effect without a given operation has no key (so it is no resend's).
    operations = unknown_operations + ((None, "fp"),) * (len(unknown) - len(unknown_operations))
    lease_epoch = current.epoch if current is not None else epoch
    return ResourceState(
        resource,
        epoch,
        current,
        tuple(
            OpenEffect(effect_id, EffectState.UNKNOWN, lease_epoch, key, fp)
            for effect_id, (key, fp) in zip(unknown, operations, strict=True)
        )
        + tuple(
            OpenEffect(effect_id, EffectState.DISPATCHING, lease_epoch, None, "fp")
            for effect_id in dispatching
        ),
    )


def never_leased() -> ResourceState:
    return state(None)


def superseded() -> tuple[LeaseRecord, ResourceState]:
    """The token's lease at epoch 3 expired; another worker now holds epoch 4."""
    old = lease(epoch=3, expires_at=NOW - 10)
    return old, state(lease(epoch=4, holder="worker-2"))


def revoked() -> tuple[LeaseRecord, ResourceState]:
    """An operator revoked epoch 3: the epoch moved to 4 with no lease granted at it."""
    old = lease(epoch=3, ended_at=NOW - 1, end_reason="revoked: stuck worker")
    return old, state(None, epoch=4)


def released() -> tuple[LeaseRecord, ResourceState]:
    """The holder released epoch 3 (before its expiry); the epoch stays at 3."""
    ended = lease(epoch=3, ended_at=NOW - 1, end_reason="released")
    return ended, state(ended)


def request(
    key: str | None = "order-1",
    fingerprint: str = "fp-1",
    max_in_flight: int = 1,
    timeout_s: float = TIMEOUT,
    resource: str = RESOURCE,
    upstream_idempotent: bool = False,
) -> AdmissionRequest:
    return AdmissionRequest(
        resource, key, fingerprint, max_in_flight, timeout_s, upstream_idempotent
    )


def stored(
    effect_state: EffectState = EffectState.COMMITTED,
    fingerprint: str = "fp-1",
    expires_at: float | None = NOW + 3600,
    epoch: int = 3,
    effect_id: str = "eff-1",
) -> IdempotencyRecord:
    response = (
        StoredResponse(201, (("Content-Type", "application/json"),), b'{"id": 1}')
        if effect_state is EffectState.COMMITTED
        else None
    )
    return IdempotencyRecord(
        resource=RESOURCE,
        key="order-1",
        fingerprint=fingerprint,
        effect_id=effect_id,
        effect_state=effect_state,
        epoch=epoch,
        expires_at=expires_at,
        response=response,
    )


def refused(decision: object, code: str) -> Refusal:
    assert isinstance(decision, Refusal), decision
    assert decision.code == code, decision
    return decision


# --- the records the rules read ---------------------------------------------------------


def test_an_ended_lease_is_not_the_current_lease() -> None:
    ended, after_release = released()
    assert after_release.current_lease() is None
    assert after_release.lease is ended
    expired = lease(expires_at=NOW - 1)
    assert state(expired).current_lease() is expired  # expired but not ended: still current


def test_lease_is_live_until_but_not_at_its_expiry() -> None:
    assert lease(expires_at=NOW + 0.001).live(NOW)
    assert not lease(expires_at=NOW).live(NOW)
    assert not lease(ended_at=NOW - 1).live(NOW)


def test_blocked_is_one_definition_for_everyone_but_the_holders_own_requests() -> None:
    mixed = state(lease(epoch=2), epoch=2, unknown=("u1",), dispatching=("d1", "d2"))
    # Acquire and the lease view: anything unsettled blocks.
    assert sorted(mixed.blocking()) == ["d1", "d2", "u1"]
    # The holder at epoch 2: its own requests in flight do not (max_in_flight bounds them).
    assert mixed.blocking(2) == ("u1",)
    # A request in flight under an older epoch blocks even the current holder.
    assert sorted(mixed.blocking(3)) == ["d1", "d2", "u1"]


# --- decide_acquire ---------------------------------------------------------------------


def test_acquire_on_a_never_leased_resource_grants_epoch_1() -> None:
    assert decide_acquire(never_leased(), TTL, NOW) == Grant(1, NOW + TTL)


def test_acquire_after_expiry_grants_the_next_epoch() -> None:
    expired = lease(epoch=3, expires_at=NOW - 1)
    assert decide_acquire(state(expired), TTL, NOW) == Grant(4, NOW + TTL)


def test_acquire_at_the_exact_expiry_instant_grants() -> None:
    # now == expires_at: the lease is no longer live.
    at_expiry = lease(epoch=3, expires_at=NOW)
    assert decide_acquire(state(at_expiry), TTL, NOW) == Grant(4, NOW + TTL)


def test_acquire_after_release_grants_the_next_epoch() -> None:
    _, after_release = released()
    assert decide_acquire(after_release, TTL, NOW) == Grant(4, NOW + TTL)


def test_acquire_after_revocation_grants_above_the_revoked_epoch() -> None:
    _, after_revoke = revoked()
    assert decide_acquire(after_revoke, TTL, NOW) == Grant(5, NOW + TTL)


def test_acquire_while_a_lease_is_live_is_lease_held() -> None:
    live = lease(epoch=3, expires_at=NOW + 0.001)
    refusal = refused(decide_acquire(state(live), TTL, NOW), "lease_held")
    assert refusal.context["resource"] == RESOURCE
    assert refusal.context["current_epoch"] == 3


def test_acquire_by_the_same_holder_label_is_still_lease_held() -> None:
    # The holder is a label, not an identity: a second acquisition must not share a lease.
    live = lease(epoch=3, holder="worker-1")
    refused(decide_acquire(state(live), TTL, NOW), "lease_held")


def test_lease_held_retry_after_rounds_the_remaining_time_up() -> None:
    live = lease(expires_at=NOW + 12.2)
    refusal = refused(decide_acquire(state(live), TTL, NOW), "lease_held")
    assert refusal.context["retry_after_s"] == 13


def test_lease_held_retry_after_is_at_least_one_second() -> None:
    live = lease(expires_at=NOW + 0.2)
    refusal = refused(decide_acquire(state(live), TTL, NOW), "lease_held")
    assert refusal.context["retry_after_s"] == 1


def test_lease_held_response_sets_retry_after_header() -> None:
    live = lease(expires_at=NOW + 7)
    refusal = refused(decide_acquire(state(live), TTL, NOW), "lease_held")
    response = refusal_response(refusal)
    assert response.status == 409
    assert response.headers["Retry-After"] == "7"
    assert response.content_type == "application/problem+json"


def test_acquire_after_expiry_with_an_unknown_effect_is_resource_blocked() -> None:
    expired = lease(epoch=3, expires_at=NOW - 1)
    decision = decide_acquire(state(expired, unknown=("eff-9",)), TTL, NOW)
    refusal = refused(decision, "resource_blocked")
    assert refusal.context["effect_ids"] == ["eff-9"]


def test_acquire_after_expiry_with_a_dispatching_effect_is_resource_blocked() -> None:
    # The old holder's write may still land: no successor starts from an unknown state.
    expired = lease(epoch=3, expires_at=NOW - 1)
    decision = decide_acquire(state(expired, dispatching=("eff-8",)), TTL, NOW)
    assert refused(decision, "resource_blocked").context["effect_ids"] == ["eff-8"]


def test_acquire_after_release_with_an_unknown_effect_is_resource_blocked() -> None:
    ended, _ = released()
    refused(decide_acquire(state(ended, unknown=("eff-9",)), TTL, NOW), "resource_blocked")


def test_acquire_after_revocation_with_an_unknown_effect_is_resource_blocked() -> None:
    decision = decide_acquire(state(None, epoch=4, unknown=("eff-9",)), TTL, NOW)
    refused(decision, "resource_blocked")


def test_acquire_lists_every_effect_in_doubt_when_blocked() -> None:
    blocked = state(None, epoch=2, unknown=("u1",), dispatching=("d1",))
    refusal = refused(decide_acquire(blocked, TTL, NOW), "resource_blocked")
    assert sorted(refusal.context["effect_ids"]) == ["d1", "u1"]


# --- check_lease / decide_renew ---------------------------------------------------------


def test_current_live_lease_passes() -> None:
    current = lease()
    assert check_lease(current, state(current), NOW) is None


def test_no_lease_record_is_invalid_token() -> None:
    refused(check_lease(None, state(lease()), NOW), "invalid_token")
    refused(check_lease(None, None, NOW), "invalid_token")


def test_lease_without_resource_state_is_invalid_token() -> None:
    refused(check_lease(lease(), None, NOW), "invalid_token")


def test_superseded_lease_is_stale_epoch() -> None:
    old, now_state = superseded()
    refusal = refused(check_lease(old, now_state, NOW), "stale_epoch")
    assert refusal.context == {"resource": RESOURCE, "epoch": 3, "current_epoch": 4}
    assert "superseded" in refusal.detail


def test_revoked_lease_is_stale_epoch_and_says_why() -> None:
    old, now_state = revoked()
    refusal = refused(check_lease(old, now_state, NOW), "stale_epoch")
    assert refusal.context["current_epoch"] == 4
    assert "revoked: stuck worker" in refusal.detail


def test_released_lease_is_stale_epoch_even_before_its_expiry() -> None:
    ended, now_state = released()
    assert ended.expires_at > NOW
    refusal = refused(check_lease(ended, now_state, NOW), "stale_epoch")
    assert refusal.context["current_epoch"] == 3
    assert "released" in refusal.detail


def test_current_lease_past_expiry_is_lease_expired() -> None:
    expired = lease(expires_at=NOW - 1)
    refusal = refused(check_lease(expired, state(expired), NOW), "lease_expired")
    assert refusal.context == {"resource": RESOURCE, "epoch": 3, "current_epoch": 3}


def test_lease_at_the_exact_expiry_instant_is_expired() -> None:
    at_expiry = lease(expires_at=NOW)
    refused(check_lease(at_expiry, state(at_expiry), NOW), "lease_expired")


def test_superseded_and_expired_lease_is_stale_not_expired() -> None:
    old, now_state = superseded()
    assert not old.live(NOW)
    refused(check_lease(old, now_state, NOW), "stale_epoch")


def test_renew_a_live_lease_passes() -> None:
    current = lease()
    assert decide_renew(current, state(current), NOW, NO_AUTH) is None


def test_renew_an_expired_lease_is_refused() -> None:
    expired = lease(expires_at=NOW - 1)
    refused(decide_renew(expired, state(expired), NOW, NO_AUTH), "lease_expired")


def test_renew_a_superseded_lease_is_stale_epoch() -> None:
    old, now_state = superseded()
    refused(decide_renew(old, now_state, NOW, NO_AUTH), "stale_epoch")


def test_renew_a_released_lease_is_stale_epoch() -> None:
    ended, now_state = released()
    refused(decide_renew(ended, now_state, NOW, NO_AUTH), "stale_epoch")


def test_renew_without_a_lease_record_is_invalid_token() -> None:
    refused(decide_renew(None, None, NOW, NO_AUTH), "invalid_token")


# --- decide_release ---------------------------------------------------------------------


def test_release_a_live_lease_passes() -> None:
    current = lease()
    assert decide_release(current, state(current), NOW) is None


def test_release_an_expired_but_current_lease_passes() -> None:
    expired = lease(expires_at=NOW - 100)
    assert decide_release(expired, state(expired), NOW) is None


def test_release_a_superseded_lease_is_stale_epoch() -> None:
    old, now_state = superseded()
    refused(decide_release(old, now_state, NOW), "stale_epoch")


def test_release_a_revoked_lease_is_stale_epoch() -> None:
    old, now_state = revoked()
    refused(decide_release(old, now_state, NOW), "stale_epoch")


def test_release_twice_is_stale_epoch() -> None:
    ended, now_state = released()
    refused(decide_release(ended, now_state, NOW), "stale_epoch")


def test_release_without_a_lease_record_is_invalid_token() -> None:
    refused(decide_release(None, None, NOW), "invalid_token")


# --- decide_admission: each rule --------------------------------------------------------


def admit(
    lease_record: LeaseRecord | None,
    resource_state: ResourceState | None,
    existing: IdempotencyRecord | None = None,
    req: AdmissionRequest | None = None,
) -> Admit | Replay | Refusal:
    return decide_admission(req or request(), lease_record, resource_state, existing, NOW, NO_AUTH)


def test_current_live_lease_with_a_fresh_key_is_admitted() -> None:
    current = lease()
    assert admit(current, state(current)) == Admit()


def test_request_without_an_idempotency_key_is_admitted() -> None:
    current = lease()
    assert admit(current, state(current), req=request(key=None)) == Admit()


def test_admission_without_a_lease_record_is_invalid_token() -> None:
    refused(admit(None, None), "invalid_token")


def test_admission_with_a_lease_of_another_resource_is_wrong_resource() -> None:
    other = lease(resource="supplier:gadget")
    refusal = refused(admit(other, state(other, resource="supplier:gadget")), "wrong_resource")
    assert refusal.context == {"resource": RESOURCE, "token_resource": "supplier:gadget"}


def test_admission_after_supersession_is_stale_epoch() -> None:
    refused(admit(*superseded()), "stale_epoch")


def test_admission_after_revocation_is_stale_epoch() -> None:
    refusal = refused(admit(*revoked()), "stale_epoch")
    assert "revoked" in refusal.detail


def test_admission_after_release_is_stale_epoch() -> None:
    refused(admit(*released()), "stale_epoch")


def test_admission_on_an_expired_lease_is_lease_expired() -> None:
    expired = lease(expires_at=NOW)
    refused(admit(expired, state(expired)), "lease_expired")


def test_admission_on_a_resource_with_an_unknown_effect_is_resource_blocked() -> None:
    current = lease()
    refusal = refused(admit(current, state(current, unknown=("eff-u",))), "resource_blocked")
    assert refusal.context["effect_ids"] == ["eff-u"]


def test_a_dispatching_effect_alone_does_not_block_admission() -> None:
    # Only UNKNOWN blocks a mutation; DISPATCHING counts against max_in_flight instead.
    current = lease()
    busy = state(current, dispatching=("eff-d",))
    assert admit(current, busy, req=request(max_in_flight=2)) == Admit()


def test_reused_key_with_a_different_request_is_idempotency_key_reused() -> None:
    current = lease()
    refusal = refused(
        admit(current, state(current), stored(fingerprint="fp-other")), "idempotency_key_reused"
    )
    assert refusal.context["effect_id"] == "eff-1"


def test_reused_key_while_its_first_request_is_dispatching_is_request_in_progress() -> None:
    current = lease()
    existing = stored(EffectState.DISPATCHING)
    refusal = refused(
        admit(current, state(current), existing, request(max_in_flight=5)), "request_in_progress"
    )
    assert refusal.context["effect_id"] == "eff-1"


def forwarding(current: LeaseRecord, key: str, fingerprint: str) -> ResourceState:
    """`current`'s resource with an effect under `key` being forwarded."""
    effect = OpenEffect("eff-d", EffectState.DISPATCHING, current.epoch, key, fingerprint)
    return ResourceState(RESOURCE, current.epoch, current, (effect,))


def test_a_key_being_forwarded_is_in_progress_whatever_its_record_says() -> None:
    # The key's record may be gone (freed by contradicting evidence, or past its
    # retention) while its effect is still on its way: the open effect decides.
    current = lease()
    busy = forwarding(current, "order-1", "fp-1")
    refusal = refused(admit(current, busy, None, request(max_in_flight=5)), "request_in_progress")
    assert refusal.context["effect_id"] == "eff-d"
    other_key = forwarding(current, "order-2", "fp-1")
    assert admit(current, other_key, None, request(max_in_flight=5)) == Admit()


def test_a_key_being_forwarded_for_another_request_is_idempotency_key_reused() -> None:
    current = lease()
    busy = forwarding(current, "order-1", "fp-other")
    refusal = refused(
        admit(current, busy, None, request(max_in_flight=5)), "idempotency_key_reused"
    )
    assert refusal.context["effect_id"] == "eff-d"


def test_the_key_of_an_effect_in_doubt_is_kept_past_its_expiry() -> None:
    current = lease()
    in_doubt = stored(EffectState.UNKNOWN, fingerprint="fp-other", expires_at=NOW - 1)
    refused(admit(current, state(current), in_doubt), "idempotency_key_reused")


def test_reused_key_of_a_committed_request_is_replayed() -> None:
    current = lease()
    existing = stored(EffectState.COMMITTED)
    assert admit(current, state(current), existing) == Replay(existing)


def test_committed_request_from_an_earlier_epoch_is_replayed_to_the_current_holder() -> None:
    current = lease(epoch=7)
    existing = stored(EffectState.COMMITTED, epoch=3)
    assert admit(current, state(current), existing) == Replay(existing)


def test_expired_idempotency_record_is_ignored() -> None:
    current = lease()
    different = stored(fingerprint="fp-other", expires_at=NOW - 1)
    assert admit(current, state(current), different) == Admit()
    committed = stored(EffectState.COMMITTED, expires_at=NOW - 1)
    assert admit(current, state(current), committed) == Admit()


def test_idempotency_record_at_its_exact_expiry_instant_is_ignored() -> None:
    current = lease()
    assert admit(current, state(current), stored(fingerprint="fp-other", expires_at=NOW)) == Admit()


def test_key_of_a_request_that_was_not_committed_may_be_sent_again() -> None:
    current = lease()
    for settled in (EffectState.NOT_COMMITTED, EffectState.NOT_SENT):
        assert admit(current, state(current), stored(settled)) == Admit()


def test_max_in_flight_reached_is_effect_in_flight() -> None:
    current = lease()
    busy = state(current, dispatching=("eff-a", "eff-b"))
    refusal = refused(admit(current, busy, req=request(max_in_flight=2)), "effect_in_flight")
    assert refusal.context["in_flight"] == ["eff-a", "eff-b"]


def test_below_max_in_flight_is_admitted() -> None:
    current = lease()
    busy = state(current, dispatching=("eff-a",))
    assert admit(current, busy, req=request(max_in_flight=2)) == Admit()


def test_lease_ending_before_the_upstream_timeout_is_lease_too_short() -> None:
    current = lease(expires_at=NOW + TIMEOUT - 0.0012)
    refusal = refused(admit(current, state(current)), "lease_too_short")
    assert refusal.context["expires_at"] == current.expires_at
    assert refusal.context["epoch"] == 3
    # To the millisecond: what a client reads to size its lease.
    assert refusal.context["remaining_s"] == 4.999


def test_lease_ending_exactly_at_the_upstream_timeout_is_admitted() -> None:
    current = lease(expires_at=NOW + TIMEOUT)
    assert admit(current, state(current)) == Admit()


def test_lease_too_short_uses_the_routes_upstream_timeout() -> None:
    current = lease(expires_at=NOW + 20)
    assert admit(current, state(current), req=request(timeout_s=10)) == Admit()
    refused(admit(current, state(current), req=request(timeout_s=30)), "lease_too_short")


# --- decide_admission: resending the operation in doubt ---------------------------------
# On a route whose upstream deduplicates by Idempotency-Key, the very operation that is
# UNKNOWN (same key, same request) may be sent again: the upstream applies it at most once.

OPERATION = ("order-1", "fp-1")


def blocked_by(*operations: tuple[str | None, str]) -> tuple[LeaseRecord, ResourceState]:
    current = lease()
    ids = tuple(f"eff-u{i}" for i in range(len(operations)))
    return current, state(current, unknown=ids, unknown_operations=operations)


def test_resending_the_unknown_operation_to_a_deduplicating_upstream_is_admitted() -> None:
    current, blocked = blocked_by(OPERATION)
    decision = admit(current, blocked, req=request(upstream_idempotent=True))
    assert decision == Admit(resends=("eff-u0",))


def test_resend_settles_every_unknown_effect_of_the_same_operation() -> None:
    current, blocked = blocked_by(OPERATION, OPERATION)
    decision = admit(current, blocked, req=request(upstream_idempotent=True))
    assert decision == Admit(resends=("eff-u0", "eff-u1"))


def test_resend_to_an_upstream_that_does_not_deduplicate_is_blocked() -> None:
    current, blocked = blocked_by(OPERATION)
    refused(admit(current, blocked, req=request(upstream_idempotent=False)), "resource_blocked")


def test_resend_with_another_request_body_is_blocked() -> None:
    current, blocked = blocked_by(OPERATION)
    req = request(fingerprint="fp-other", upstream_idempotent=True)
    refused(admit(current, blocked, req=req), "resource_blocked")


def test_resend_with_another_key_is_blocked() -> None:
    current, blocked = blocked_by(OPERATION)
    req = request(key="order-2", upstream_idempotent=True)
    refused(admit(current, blocked, req=req), "resource_blocked")


def test_resend_without_a_key_is_blocked() -> None:
    current, blocked = blocked_by((None, "fp-1"))
    req = request(key=None, upstream_idempotent=True)
    refused(admit(current, blocked, req=req), "resource_blocked")


def test_resend_is_blocked_while_another_operation_is_also_unknown() -> None:
    current, blocked = blocked_by(OPERATION, ("order-2", "fp-2"))
    refused(admit(current, blocked, req=request(upstream_idempotent=True)), "resource_blocked")


def test_resend_is_blocked_when_an_unknown_effect_has_no_known_operation() -> None:
    current = lease()
    blocked = state(current, unknown=("eff-a", "eff-b"), unknown_operations=(OPERATION,))
    refused(admit(current, blocked, req=request(upstream_idempotent=True)), "resource_blocked")


def test_resend_passes_over_the_unknown_effects_own_idempotency_record() -> None:
    current, blocked = blocked_by(OPERATION)
    existing = stored(EffectState.UNKNOWN, effect_id="eff-u0")
    decision = admit(current, blocked, existing, request(upstream_idempotent=True))
    assert decision == Admit(resends=("eff-u0",))


def test_a_key_held_by_an_unsettled_effect_other_than_the_resent_ones_is_blocked() -> None:
    current, blocked = blocked_by(OPERATION)
    existing = stored(EffectState.UNKNOWN, effect_id="eff-elsewhere")
    decision = admit(current, blocked, existing, request(upstream_idempotent=True))
    assert refused(decision, "resource_blocked").context["effect_ids"] == ["eff-elsewhere"]


def test_resend_by_a_stale_holder_is_stale_epoch() -> None:
    old, now_state = superseded()
    blocked = state(now_state.lease, unknown=("eff-u0",), unknown_operations=(OPERATION,))
    refused(admit(old, blocked, req=request(upstream_idempotent=True)), "stale_epoch")


def test_resend_still_needs_a_lease_that_covers_the_upstream_timeout() -> None:
    current = lease(expires_at=NOW + 1)
    blocked = state(current, unknown=("eff-u0",), unknown_operations=(OPERATION,))
    refused(admit(current, blocked, req=request(upstream_idempotent=True)), "lease_too_short")


def test_resend_still_respects_the_in_flight_limit() -> None:
    current = lease()
    blocked = state(
        current, unknown=("eff-u0",), dispatching=("eff-d",), unknown_operations=(OPERATION,)
    )
    refused(admit(current, blocked, req=request(upstream_idempotent=True)), "effect_in_flight")


def test_acquire_is_still_blocked_by_an_operation_a_holder_could_resend() -> None:
    expired = lease(expires_at=NOW - 1)
    blocked = state(expired, unknown=("eff-u0",), unknown_operations=(OPERATION,))
    refused(decide_acquire(blocked, TTL, NOW), "resource_blocked")


# --- decide_admission: the order of checks ----------------------------------------------


def test_wrong_resource_comes_before_stale_epoch() -> None:
    old = lease(epoch=3, resource="supplier:gadget")
    newer = state(lease(epoch=4, resource="supplier:gadget"), resource="supplier:gadget")
    refused(admit(old, newer), "wrong_resource")


def test_stale_token_on_a_blocked_resource_is_stale_epoch_not_blocked() -> None:
    old, now_state = superseded()
    blocked = state(now_state.lease, unknown=("eff-u",))
    refused(admit(old, blocked), "stale_epoch")


def test_expired_token_on_a_blocked_resource_is_lease_expired_not_blocked() -> None:
    expired = lease(expires_at=NOW - 1)
    refused(admit(expired, state(expired, unknown=("eff-u",))), "lease_expired")


def test_stale_holder_never_gets_a_replay() -> None:
    # A stale holder learns nothing about stored responses.
    old, now_state = superseded()
    existing = stored(EffectState.COMMITTED, epoch=3)
    refusal = refused(admit(old, now_state, existing), "stale_epoch")
    assert "effect_id" not in refusal.context
    assert "response" not in json.dumps(refusal.context)


def test_revoked_holder_never_gets_a_replay() -> None:
    refused(admit(*revoked(), existing=stored(EffectState.COMMITTED)), "stale_epoch")


def test_expired_holder_never_gets_a_replay() -> None:
    expired = lease(expires_at=NOW - 1)
    refused(admit(expired, state(expired), stored(EffectState.COMMITTED)), "lease_expired")


def test_unknown_token_never_gets_a_replay() -> None:
    refused(admit(None, None, stored(EffectState.COMMITTED)), "invalid_token")


def test_token_of_another_resource_never_gets_a_replay() -> None:
    other = lease(resource="supplier:gadget")
    existing = stored(EffectState.COMMITTED)
    refused(admit(other, state(other, resource="supplier:gadget"), existing), "wrong_resource")


def test_stale_holder_with_a_reused_key_learns_stale_epoch_not_key_reused() -> None:
    old, now_state = superseded()
    refused(admit(old, now_state, stored(fingerprint="fp-other")), "stale_epoch")


def test_blocked_resource_comes_before_a_replay() -> None:
    current = lease()
    blocked = state(current, unknown=("eff-u",))
    refused(admit(current, blocked, stored(EffectState.COMMITTED)), "resource_blocked")


def test_reused_key_comes_before_the_in_flight_limit() -> None:
    current = lease()
    busy = state(current, dispatching=("eff-a",))
    refused(admit(current, busy, stored(fingerprint="fp-other")), "idempotency_key_reused")


def test_request_in_progress_comes_before_the_in_flight_limit() -> None:
    current = lease()
    busy = state(current, dispatching=("eff-1",))
    refused(admit(current, busy, stored(EffectState.DISPATCHING)), "request_in_progress")


def test_replay_comes_before_the_in_flight_limit() -> None:
    current = lease()
    busy = state(current, dispatching=("eff-a",))
    existing = stored(EffectState.COMMITTED)
    assert admit(current, busy, existing) == Replay(existing)


def test_replay_comes_before_the_lease_length_check() -> None:
    current = lease(expires_at=NOW + 1)
    existing = stored(EffectState.COMMITTED)
    assert admit(current, state(current), existing) == Replay(existing)


def test_in_flight_limit_comes_before_the_lease_length_check() -> None:
    current = lease(expires_at=NOW + 1)
    busy = state(current, dispatching=("eff-a",))
    refused(admit(current, busy), "effect_in_flight")


# --- refusal codes and the contract's statuses ------------------------------------------

CONTRACT_STATUS = {
    "invalid_request": 400,
    "missing_idempotency_key": 400,
    "missing_token": 401,
    "unauthorized": 401,
    "invalid_token": 403,
    "wrong_resource": 403,
    "no_route": 404,
    "stale_epoch": 409,
    "lease_expired": 409,
    "lease_held": 409,
    "effect_in_flight": 409,
    "request_in_progress": 409,
    "lease_too_short": 409,
    "payload_too_large": 413,
    "idempotency_key_reused": 422,
    "resource_blocked": 423,
    "upstream_unreachable": 502,
    "outcome_unknown": 504,
}


def test_every_contract_code_has_the_contract_status() -> None:
    assert {code: ErrorCode(code).status for code in CONTRACT_STATUS} == CONTRACT_STATUS


def test_refusal_response_is_problem_json_with_code_and_context() -> None:
    old, now_state = superseded()
    response = refusal_response(refused(admit(old, now_state), "stale_epoch"))
    assert response.status == 409
    assert response.content_type == "application/problem+json"
    assert "Retry-After" not in response.headers
    assert isinstance(response.body, bytes)
    body = json.loads(response.body)
    assert body["code"] == "stale_epoch"
    assert body["status"] == 409
    assert (body["epoch"], body["current_epoch"], body["resource"]) == (3, 4, RESOURCE)
    assert {"type", "title", "detail"} <= set(body)


# --- holder_came_back: a refusal that proves a false expiry ---------------------------------


def test_a_holder_comes_back_only_to_a_lease_that_expired_before_it_ended() -> None:
    expired = lease(expires_at=NOW - 1)
    assert holder_came_back(expired, "lease_expired", NOW)
    assert holder_came_back(expired, "stale_epoch", NOW)
    assert holder_came_back(expired, "wrong_resource", NOW) is False
    assert holder_came_back(None, "stale_epoch", NOW) is False
    released_in_time = lease(expires_at=NOW - 1, ended_at=NOW - 2)
    assert not holder_came_back(released_in_time, "stale_epoch", NOW)
    superseded = lease(expires_at=NOW - 2, ended_at=NOW - 1)
    assert holder_came_back(superseded, "stale_epoch", NOW)
    live = lease(expires_at=NOW + 1)
    assert not holder_came_back(live, "stale_epoch", NOW)
    # Boundaries: a lease is over at its expiry, so one ended (or asked about) at that
    # very instant had expired under its holder.
    ended_at_expiry = lease(expires_at=NOW - 1, ended_at=NOW - 1)
    assert holder_came_back(ended_at_expiry, "stale_epoch", NOW)
    assert holder_came_back(lease(expires_at=NOW), "lease_expired", NOW)
