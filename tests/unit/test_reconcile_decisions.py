"""Reconciliation rules as pure functions, with an explicit `now`.

What a probe answer proves (the settle rule), when to probe again (backoff), when
an operator may decide (check_resolvable), and when the current holder may resend
the operation in doubt (decide_admission on an `upstream_idempotent` route). Each
test fails if the rule it names is removed.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import pytest

from core.fencing import NO_AUTH, AdmissionRequest, Admit, decide_admission
from core.lifecycle import DEADLINE_MARGIN_S, check_resolvable
from core.probing import (
    FIRST_RETRY_S,
    MAX_RETRY_S,
    Conclusion,
    judge_probe,
    next_probe_at,
)
from core.records import (
    EffectRecord,
    EffectState,
    IdempotencyRecord,
    LeaseRecord,
    OpenEffect,
    Refusal,
    ResourceState,
)
from policies import Outcome, Probe, Reconcile, StatusRules
from policies.templates import StringTemplate
from tests.unit.effects import an_effect

NOW = 1_000_000.0
DISPATCHED = NOW - 100.0
SETTLE_S = 2.0
RESOURCE = "supplier:widget"


def reconcile(settle_s: float = SETTLE_S, attempts: int = 5) -> Reconcile:
    """The DESIGN.md example: 200 means committed, 404 not committed."""
    rules = StatusRules(
        exact=((200, Outcome.COMMITTED), (404, Outcome.NOT_COMMITTED)),
        classes=(),
        default=Outcome.UNKNOWN,
    )
    probe = Probe("GET", StringTemplate.parse("/orders/by-key/{idempotency_key}"))
    return Reconcile(probe, rules, settle_s, attempts)


# --- judge_probe: what one probe answer proves -------------------------------------------


def test_a_committed_answer_settles_committed_at_once() -> None:
    # Even zero seconds after dispatch: a write that is found has happened.
    verdict = judge_probe(200, None, reconcile(), DISPATCHED, DISPATCHED)
    assert verdict.conclusion is Conclusion.COMMITTED
    assert "200" in verdict.detail


def test_a_not_committed_answer_before_settle_s_is_inconclusive() -> None:
    just_before = DISPATCHED + SETTLE_S - 0.001
    verdict = judge_probe(404, None, reconcile(), DISPATCHED, just_before)
    assert verdict.conclusion is Conclusion.INCONCLUSIVE
    assert "settle_s" in verdict.detail


def test_a_not_committed_answer_right_at_dispatch_is_inconclusive() -> None:
    verdict = judge_probe(404, None, reconcile(), DISPATCHED, DISPATCHED)
    assert verdict.conclusion is Conclusion.INCONCLUSIVE


def test_a_not_committed_answer_once_settle_s_has_passed_settles_not_committed() -> None:
    at_boundary = DISPATCHED + SETTLE_S
    assert judge_probe(404, None, reconcile(), DISPATCHED, at_boundary).conclusion is (
        Conclusion.NOT_COMMITTED
    )
    later = DISPATCHED + SETTLE_S + 60
    assert judge_probe(404, None, reconcile(), DISPATCHED, later).conclusion is (
        Conclusion.NOT_COMMITTED
    )


def test_the_settle_window_is_measured_from_dispatch_not_from_the_epoch() -> None:
    # settle_s is relative: a late-dispatched effect is not judged by an early clock.
    late_dispatch = NOW
    verdict = judge_probe(404, None, reconcile(), late_dispatch, NOW + SETTLE_S / 2)
    assert verdict.conclusion is Conclusion.INCONCLUSIVE


@pytest.mark.parametrize("status", [500, 503, 302, 201, 409])
def test_an_unmapped_status_is_inconclusive(status: int) -> None:
    verdict = judge_probe(status, None, reconcile(), DISPATCHED, NOW)
    assert verdict.conclusion is Conclusion.INCONCLUSIVE
    assert str(status) in verdict.detail


def test_a_failed_probe_is_inconclusive_and_says_why() -> None:
    why = "ClientConnectorError: connection refused"
    verdict = judge_probe(None, why, reconcile(), DISPATCHED, NOW)
    assert verdict.conclusion is Conclusion.INCONCLUSIVE
    assert why in verdict.detail


# --- next_probe_at: backoff ----------------------------------------------------------------


def test_retries_back_off_exponentially() -> None:
    rules = reconcile(attempts=8)
    delays = [
        at - NOW
        for at in (next_probe_at(made, rules, DISPATCHED, NOW) for made in range(1, 6))
        if at is not None
    ]
    assert len(delays) == 5
    assert delays[0] == pytest.approx(FIRST_RETRY_S)
    for earlier, later in pairwise(delays):
        assert later == pytest.approx(2 * earlier)


def test_backoff_is_capped() -> None:
    rules = reconcile(attempts=100)
    at = next_probe_at(40, rules, DISPATCHED, NOW)
    assert at == pytest.approx(NOW + MAX_RETRY_S)


def test_a_retry_is_never_scheduled_before_the_settle_window_ends() -> None:
    # A first probe right at dispatch answered "not found": asking again after the
    # plain backoff (0.5 s) would only be inconclusive again.
    rules = reconcile(settle_s=10.0)
    at = next_probe_at(1, rules, NOW, NOW)
    assert at == pytest.approx(NOW + 10.0)
    assert at is not None and at > NOW + FIRST_RETRY_S


def test_the_backoff_applies_once_the_settle_window_has_passed() -> None:
    rules = reconcile(settle_s=10.0)
    at = next_probe_at(1, rules, NOW - 60, NOW)
    assert at == pytest.approx(NOW + FIRST_RETRY_S)


def test_no_retry_once_the_attempts_are_used_up() -> None:
    rules = reconcile(attempts=5)
    assert next_probe_at(4, rules, DISPATCHED, NOW) is not None
    assert next_probe_at(5, rules, DISPATCHED, NOW) is None
    assert next_probe_at(6, rules, DISPATCHED, NOW) is None


def test_a_single_attempt_means_no_retry() -> None:
    assert next_probe_at(1, reconcile(attempts=1), DISPATCHED, NOW) is None


# --- check_resolvable: when an operator may decide ------------------------------------------


def effect(state: EffectState, deadline: float = NOW + 5.0) -> EffectRecord:
    return an_effect(state, deadline)


def refused(decision: object, code: str) -> Refusal:
    assert isinstance(decision, Refusal), decision
    assert decision.code == code, decision
    return decision


def test_an_unknown_effect_may_be_resolved() -> None:
    assert check_resolvable(effect(EffectState.UNKNOWN), NOW) is None


def test_a_dispatching_effect_within_its_deadline_is_refused_as_in_flight() -> None:
    refusal = refused(
        check_resolvable(effect(EffectState.DISPATCHING, deadline=NOW + 5), NOW),
        "effect_in_flight",
    )
    assert refusal.context["effect_id"] == "eff-1"


def test_a_dispatching_effect_is_in_flight_until_deadline_plus_margin() -> None:
    deadline = NOW - 1.0
    assert DEADLINE_MARGIN_S > 1.0
    # Past the deadline but within the margin: the request may still be on its way.
    refused(check_resolvable(effect(EffectState.DISPATCHING, deadline), NOW), "effect_in_flight")
    at_margin = deadline + DEADLINE_MARGIN_S
    refused(
        check_resolvable(effect(EffectState.DISPATCHING, deadline), at_margin), "effect_in_flight"
    )


def test_a_dispatching_effect_past_deadline_plus_margin_may_be_resolved() -> None:
    deadline = NOW - DEADLINE_MARGIN_S - 0.001
    assert check_resolvable(effect(EffectState.DISPATCHING, deadline), NOW) is None


@pytest.mark.parametrize(
    "state", [EffectState.COMMITTED, EffectState.NOT_COMMITTED, EffectState.NOT_SENT]
)
def test_a_settled_effect_is_refused_as_settled(state: EffectState) -> None:
    refusal = refused(check_resolvable(effect(state, deadline=NOW - 3600), NOW), "effect_settled")
    assert refusal.context["state"] == state.value


# --- decide_admission: resending the operation in doubt --------------------------------------

KEY = "order-1"
FINGERPRINT = "fp-1"


def current_lease(epoch: int = 3) -> LeaseRecord:
    return LeaseRecord(RESOURCE, epoch, "worker-1", NOW - 10, NOW + 60, None, None)


def blocked_state(
    operations: tuple[tuple[str | None, str], ...] = ((KEY, FINGERPRINT),),
    lease: LeaseRecord | None = None,
    epoch: int = 3,
    dispatching: tuple[str, ...] = (),
) -> ResourceState:
    return ResourceState(
        RESOURCE,
        epoch,
        lease or current_lease(epoch),
        open_effects=tuple(
            OpenEffect(f"eff-u{i}", EffectState.UNKNOWN, epoch, key, fingerprint)
            for i, (key, fingerprint) in enumerate(operations)
        )
        + tuple(
            OpenEffect(effect_id, EffectState.DISPATCHING, epoch, None, "fp-other")
            for effect_id in dispatching
        ),
    )


def resend(
    key: str | None = KEY, fingerprint: str = FINGERPRINT, upstream_idempotent: bool = True
) -> AdmissionRequest:
    return AdmissionRequest(RESOURCE, key, fingerprint, 1, 5.0, upstream_idempotent)


def key_record(effect_id: str = "eff-u0") -> IdempotencyRecord:
    """The key's record, pointing at the UNKNOWN effect it was last claimed by."""
    return IdempotencyRecord(
        resource=RESOURCE,
        key=KEY,
        fingerprint=FINGERPRINT,
        effect_id=effect_id,
        effect_state=EffectState.UNKNOWN,
        epoch=3,
        expires_at=NOW + 3600,
        response=None,
    )


def test_resending_the_same_operation_is_admitted_and_names_the_effect_it_settles() -> None:
    state = blocked_state()
    decision = decide_admission(resend(), current_lease(), state, key_record(), NOW, NO_AUTH)
    assert decision == Admit(resends=("eff-u0",))


def test_a_resend_names_every_unknown_effect_of_that_operation() -> None:
    state = blocked_state(((KEY, FINGERPRINT), (KEY, FINGERPRINT)))
    decision = decide_admission(
        resend(), current_lease(), state, key_record("eff-u1"), NOW, NO_AUTH
    )
    assert decision == Admit(resends=("eff-u0", "eff-u1"))


def test_a_resend_with_a_different_request_is_blocked() -> None:
    decision = decide_admission(
        resend(fingerprint="fp-other"), current_lease(), blocked_state(), key_record(), NOW, NO_AUTH
    )
    # Blocked, not idempotency_key_reused: the block is checked before the key.
    refusal = refused(decision, "resource_blocked")
    assert refusal.context["effect_ids"] == ["eff-u0"]


def test_a_resend_with_a_different_key_is_blocked() -> None:
    decision = decide_admission(
        resend(key="order-2"), current_lease(), blocked_state(), None, NOW, NO_AUTH
    )
    refused(decision, "resource_blocked")


def test_a_request_without_a_key_is_blocked() -> None:
    decision = decide_admission(
        resend(key=None), current_lease(), blocked_state(), None, NOW, NO_AUTH
    )
    refused(decision, "resource_blocked")


def test_a_resend_on_a_route_whose_upstream_does_not_deduplicate_is_blocked() -> None:
    decision = decide_admission(
        resend(upstream_idempotent=False),
        current_lease(),
        blocked_state(),
        key_record(),
        NOW,
        NO_AUTH,
    )
    refused(decision, "resource_blocked")


def test_a_resend_is_blocked_if_any_unknown_effect_is_another_operation() -> None:
    state = blocked_state(((KEY, FINGERPRINT), ("order-2", "fp-2")))
    decision = decide_admission(resend(), current_lease(), state, key_record(), NOW, NO_AUTH)
    refused(decision, "resource_blocked")


def test_an_unknown_effect_without_a_key_is_never_matched_by_a_resend() -> None:
    state = blocked_state(((None, FINGERPRINT),))
    decision = decide_admission(resend(), current_lease(), state, None, NOW, NO_AUTH)
    refused(decision, "resource_blocked")


def test_only_the_current_holder_may_resend() -> None:
    # The operation's original holder at epoch 3 lost the resource to epoch 4.
    old = current_lease(epoch=3)
    state = blocked_state(lease=replace(current_lease(epoch=4), holder="worker-2"), epoch=4)
    decision = decide_admission(resend(), old, state, key_record(), NOW, NO_AUTH)
    refused(decision, "stale_epoch")


def test_a_resend_still_respects_the_in_flight_limit() -> None:
    state = blocked_state(dispatching=("eff-d0",))
    decision = decide_admission(resend(), current_lease(), state, key_record(), NOW, NO_AUTH)
    refused(decision, "effect_in_flight")
