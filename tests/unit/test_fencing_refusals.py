"""What each fencing refusal tells the client, word for word.

A refusal becomes a problem+json body: `detail` is what a worker's log (and its
operator) shows, `context` the machine-readable members. The rule tests check the
code of each refusal; these check that the detail names the right resource,
epochs, counts and times, and that the context carries every member.
"""

from __future__ import annotations

from core.fencing import (
    NO_AUTH,
    AdmissionRequest,
    Admit,
    check_lease,
    decide_acquire,
    decide_admission,
)
from core.records import (
    EffectState,
    IdempotencyRecord,
    LeaseRecord,
    OpenEffect,
    Refusal,
    ResourceState,
)

NOW = 1_000_000.0
RESOURCE = "supplier:widget"


def lease(
    epoch: int = 3,
    expires_at: float = NOW + 60,
    ended_at: float | None = None,
    end_reason: str | None = None,
) -> LeaseRecord:
    return LeaseRecord(
        RESOURCE, epoch, "worker-1", expires_at - 60, expires_at, ended_at, end_reason
    )


def state(
    current: LeaseRecord | None,
    epoch: int = 3,
    unknown: tuple[str, ...] = (),
    dispatching: tuple[str, ...] = (),
    unknown_operations: tuple[tuple[str | None, str], ...] = (),
) -> ResourceState:
    operations = unknown_operations + ((None, "fp"),) * (len(unknown) - len(unknown_operations))
    holder_epoch = current.epoch if current is not None else epoch
    return ResourceState(
        RESOURCE,
        epoch,
        current,
        tuple(
            OpenEffect(effect_id, EffectState.UNKNOWN, holder_epoch, key, fp)
            for effect_id, (key, fp) in zip(unknown, operations, strict=True)
        )
        + tuple(
            OpenEffect(effect_id, EffectState.DISPATCHING, holder_epoch, None, "fp")
            for effect_id in dispatching
        ),
    )


def request(max_in_flight: int = 1, timeout_s: float = 5.0) -> AdmissionRequest:
    return AdmissionRequest(RESOURCE, "order-1", "fp-1", max_in_flight, timeout_s)


def key_record(effect_state: EffectState, fingerprint: str = "fp-1") -> IdempotencyRecord:
    return IdempotencyRecord(
        resource=RESOURCE,
        key="order-1",
        fingerprint=fingerprint,
        effect_id="eff-1",
        effect_state=effect_state,
        epoch=3,
        expires_at=NOW + 3600,
        response=None,
    )


def refusal(decision: object) -> tuple[str, str, dict[str, object]]:
    assert isinstance(decision, Refusal), decision
    return decision.code, decision.detail, decision.context


def test_lease_held() -> None:
    current = lease(expires_at=NOW + 12.5)
    assert refusal(decide_acquire(state(current), 30.0, NOW)) == (
        "lease_held",
        "supplier:widget is leased until its lease expires or is released",
        {"resource": RESOURCE, "current_epoch": 3, "retry_after_s": 13},
    )


def test_resource_blocked() -> None:
    expired = lease(expires_at=NOW - 1)
    blocked = state(expired, unknown=("eff-u",), dispatching=("eff-d",))
    assert refusal(decide_acquire(blocked, 30.0, NOW)) == (
        "resource_blocked",
        "supplier:widget has effects whose outcome is not known yet or is disputed; "
        "it stays blocked until they are reconciled",
        {"resource": RESOURCE, "effect_ids": ["eff-u", "eff-d"]},
    )


def test_invalid_token() -> None:
    assert refusal(check_lease(None, None, NOW)) == (
        "invalid_token",
        "the Fence-Token is not one this proxy issued",
        {},
    )


def test_stale_epoch_names_both_epochs_and_why() -> None:
    old = lease(epoch=3, ended_at=NOW - 1, end_reason="revoked: stuck worker")
    assert refusal(check_lease(old, state(None, epoch=4), NOW)) == (
        "stale_epoch",
        "the lease at epoch 3 is no longer current (revoked: stuck worker); "
        "the resource is at epoch 4",
        {"resource": RESOURCE, "epoch": 3, "current_epoch": 4},
    )


def test_stale_epoch_without_an_end_reason_was_superseded() -> None:
    old = lease(epoch=3, expires_at=NOW - 10)
    _, detail, _ = refusal(check_lease(old, state(lease(epoch=4), epoch=4), NOW))
    assert detail == (
        "the lease at epoch 3 is no longer current (superseded); the resource is at epoch 4"
    )


def test_lease_expired() -> None:
    expired = lease(expires_at=NOW)
    assert refusal(check_lease(expired, state(expired), NOW)) == (
        "lease_expired",
        "the lease at epoch 3 has expired",
        {"resource": RESOURCE, "epoch": 3, "current_epoch": 3},
    )


def test_wrong_resource() -> None:
    other = LeaseRecord("supplier:gadget", 3, "worker-1", NOW - 10, NOW + 60, None, None)
    other_state = ResourceState("supplier:gadget", 3, other)
    assert refusal(decide_admission(request(), other, other_state, None, NOW, NO_AUTH)) == (
        "wrong_resource",
        "the token's lease guards supplier:gadget, not supplier:widget",
        {"resource": RESOURCE, "token_resource": "supplier:gadget"},
    )


def test_idempotency_key_reused() -> None:
    current = lease()
    existing = key_record(EffectState.COMMITTED, fingerprint="fp-other")
    assert refusal(
        decide_admission(request(), current, state(current), existing, NOW, NO_AUTH)
    ) == (
        "idempotency_key_reused",
        "this Idempotency-Key was used for a different request",
        {"resource": RESOURCE, "effect_id": "eff-1"},
    )


def test_request_in_progress() -> None:
    current = lease()
    existing = key_record(EffectState.DISPATCHING)
    assert refusal(
        decide_admission(request(), current, state(current), existing, NOW, NO_AUTH)
    ) == (
        "request_in_progress",
        "a request with this Idempotency-Key is in flight: being forwarded, or, after the "
        "store's answer to its admission was lost, being settled as not sent (ask again: it "
        "replays, or goes through once settled)",
        {"resource": RESOURCE, "effect_id": "eff-1"},
    )


def test_effect_in_flight_counts_the_requests_being_forwarded() -> None:
    current = lease()
    busy = state(current, dispatching=("eff-a", "eff-b"))
    assert refusal(
        decide_admission(request(max_in_flight=2), current, busy, None, NOW, NO_AUTH)
    ) == (
        "effect_in_flight",
        "supplier:widget already has 2 request(s) being forwarded",
        {"resource": RESOURCE, "in_flight": ["eff-a", "eff-b"]},
    )


def test_lease_too_short_gives_the_remaining_time_and_the_timeout() -> None:
    current = lease(expires_at=NOW + 4.25)
    decision = decide_admission(request(timeout_s=5.0), current, state(current), None, NOW, NO_AUTH)
    assert refusal(decision) == (
        "lease_too_short",
        "the lease expires in 4.250s, before the upstream timeout of 5.0s ends; renew it first",
        {
            "resource": RESOURCE,
            "epoch": 3,
            "expires_at": NOW + 4.25,
            "needed_s": 5.0,
            "remaining_s": 4.25,
        },
    )


def test_a_request_is_not_a_resend_unless_its_route_says_the_upstream_deduplicates() -> None:
    # The very operation in doubt (same key, same request), from the current holder:
    # only an explicit upstream_idempotent=True may resend it.
    current = lease()
    doubtful = state(current, unknown=("eff-u",), unknown_operations=(("order-1", "fp-1"),))
    code, _, _ = refusal(decide_admission(request(), current, doubtful, None, NOW, NO_AUTH))
    assert code == "resource_blocked"
    flagged = AdmissionRequest(RESOURCE, "order-1", "fp-1", 1, 5.0, upstream_idempotent=True)
    assert decide_admission(flagged, current, doubtful, None, NOW, NO_AUTH) == Admit(
        resends=("eff-u",)
    )
