"""receipt_event: only an upstream answer proves anything; a lost request is UNKNOWN."""

from __future__ import annotations

import pytest

from core.lifecycle import Event
from core.outcomes import Answered, Lost, NotSent, receipt_event
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
        (200, Event.ANSWERED_COMMITTED),
        (201, Event.ANSWERED_COMMITTED),
        (204, Event.ANSWERED_COMMITTED),
        (400, Event.ANSWERED_NOT_COMMITTED),
        (404, Event.ANSWERED_NOT_COMMITTED),
        (409, Event.ANSWERED_NOT_COMMITTED),
        (408, Event.LOST),
        (500, Event.LOST),
        (502, Event.LOST),
        (503, Event.LOST),
        (302, Event.LOST),
        (101, Event.LOST),
    ],
)
def test_answered_status_maps_through_the_rules(status: int, expected: Event) -> None:
    state, reason = receipt_event(Answered(status), RULES)
    assert state is expected
    assert str(status) in reason


def test_answered_reason_names_the_status_and_outcome() -> None:
    assert receipt_event(Answered(201), RULES) == (
        Event.ANSWERED_COMMITTED,
        "upstream answered 201 (committed)",
    )


def test_answered_follows_the_routes_own_rules() -> None:
    # A route may say that 409 means "already done": committed, not rejected.
    rules = StatusRules(((409, Outcome.COMMITTED),), ((4, Outcome.NOT_COMMITTED),), Outcome.UNKNOWN)
    assert receipt_event(Answered(409), rules)[0] is Event.ANSWERED_COMMITTED
    assert receipt_event(Answered(400), rules)[0] is Event.ANSWERED_NOT_COMMITTED


def test_status_the_rules_do_not_mention_is_unknown() -> None:
    rules = StatusRules(((200, Outcome.COMMITTED),), (), Outcome.UNKNOWN)
    assert receipt_event(Answered(201), rules)[0] is Event.LOST


def test_not_sent_is_not_sent() -> None:
    assert receipt_event(NotSent("connection refused"), RULES) == (
        Event.NOT_SENT,
        "not sent: connection refused",
    )


@pytest.mark.parametrize(
    "reason",
    ["timeout after 5s", "connection reset by peer", "server disconnected", "proxy restarted"],
)
def test_lost_request_is_unknown_never_not_committed(reason: str) -> None:
    state, recorded = receipt_event(Lost(reason), RULES)
    assert state is Event.LOST
    assert recorded == f"outcome unknown: {reason}"


def test_lost_request_is_unknown_whatever_the_rules_say() -> None:
    # Rules classify answers; they cannot turn a missing answer into a known outcome.
    generous = StatusRules((), (), Outcome.NOT_COMMITTED)
    assert receipt_event(Lost("timeout"), generous)[0] is Event.LOST
    assert receipt_event(NotSent("dns"), generous)[0] is Event.NOT_SENT
