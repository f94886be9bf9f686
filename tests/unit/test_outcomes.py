"""settle_dispatch: only an upstream answer proves anything; a lost request is UNKNOWN."""

from __future__ import annotations

import pytest

from core.outcomes import Answered, Lost, NotSent, settle_dispatch
from core.records import EffectState
from policies import Outcome, StatusRules

# The contract's default outcomes: committed 2xx, not_committed 4xx, unknown 408 and 5xx.
RULES = StatusRules(
    exact=((408, Outcome.UNKNOWN),),
    classes=((2, Outcome.COMMITTED), (4, Outcome.NOT_COMMITTED), (5, Outcome.UNKNOWN)),
    default=Outcome.UNKNOWN,
)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, EffectState.COMMITTED),
        (201, EffectState.COMMITTED),
        (204, EffectState.COMMITTED),
        (400, EffectState.NOT_COMMITTED),
        (404, EffectState.NOT_COMMITTED),
        (409, EffectState.NOT_COMMITTED),
        (408, EffectState.UNKNOWN),
        (500, EffectState.UNKNOWN),
        (502, EffectState.UNKNOWN),
        (503, EffectState.UNKNOWN),
        (302, EffectState.UNKNOWN),
        (101, EffectState.UNKNOWN),
    ],
)
def test_answered_status_maps_through_the_rules(status: int, expected: EffectState) -> None:
    state, reason = settle_dispatch(Answered(status), RULES)
    assert state is expected
    assert str(status) in reason


def test_answered_reason_names_the_status_and_outcome() -> None:
    assert settle_dispatch(Answered(201), RULES) == (
        EffectState.COMMITTED,
        "upstream answered 201 (committed)",
    )


def test_answered_follows_the_routes_own_rules() -> None:
    # A route may say that 409 means "already done": committed, not rejected.
    rules = StatusRules(((409, Outcome.COMMITTED),), ((4, Outcome.NOT_COMMITTED),), Outcome.UNKNOWN)
    assert settle_dispatch(Answered(409), rules)[0] is EffectState.COMMITTED
    assert settle_dispatch(Answered(400), rules)[0] is EffectState.NOT_COMMITTED


def test_status_the_rules_do_not_mention_is_unknown() -> None:
    rules = StatusRules(((200, Outcome.COMMITTED),), (), Outcome.UNKNOWN)
    assert settle_dispatch(Answered(201), rules)[0] is EffectState.UNKNOWN


def test_not_sent_is_not_sent() -> None:
    assert settle_dispatch(NotSent("connection refused"), RULES) == (
        EffectState.NOT_SENT,
        "not sent: connection refused",
    )


@pytest.mark.parametrize(
    "reason",
    ["timeout after 5s", "connection reset by peer", "server disconnected", "proxy restarted"],
)
def test_lost_request_is_unknown_never_not_committed(reason: str) -> None:
    state, recorded = settle_dispatch(Lost(reason), RULES)
    assert state is EffectState.UNKNOWN
    assert recorded == f"outcome unknown: {reason}"


def test_lost_request_is_unknown_whatever_the_rules_say() -> None:
    # Rules classify answers; they cannot turn a missing answer into a known outcome.
    generous = StatusRules((), (), Outcome.NOT_COMMITTED)
    assert settle_dispatch(Lost("timeout"), generous)[0] is EffectState.UNKNOWN
    assert settle_dispatch(NotSent("dns"), generous)[0] is EffectState.NOT_SENT
