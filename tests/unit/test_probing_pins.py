"""The documented reconciliation timings, pinned as literal numbers, and the
words an operator reads about them.

The docs (docs/how-to/reconciliation.md) promise a first retry after 0.5 s, doubling
up to 30 s, and a DISPATCHING effect treated as in flight until 2 s past its deadline. Tests that
read these values back from the constants pass whatever the constants say; these
tests fail if a constant, or the arithmetic that uses it, drifts from the promise.
"""

from __future__ import annotations

import pytest

from core.lifecycle import DEADLINE_MARGIN_S, Event, check_resolvable
from core.probing import (
    FIRST_RETRY_S,
    MAX_RETRY_S,
    Conclusion,
    judge_probe,
    next_probe_at,
)
from core.records import EffectRecord, EffectState, Refusal
from policies import Outcome, Probe, Reconcile, StatusRules
from policies.templates import StringTemplate
from tests.unit.effects import an_effect

NOW = 1_000_000.0
LONG_AGO = NOW - 3600.0  # dispatched long before: the settle window plays no part


def reconcile(attempts: int = 100, settle_s: float = 2.0) -> Reconcile:
    rules = StatusRules(
        exact=((200, Outcome.COMMITTED), (404, Outcome.NOT_COMMITTED)),
        classes=(),
        default=Outcome.UNKNOWN,
    )
    probe = Probe("GET", StringTemplate.parse("/orders/by-key/{idempotency_key}"))
    return Reconcile(probe, rules, settle_s, attempts)


def effect(deadline: float, state: EffectState = EffectState.DISPATCHING) -> EffectRecord:
    return an_effect(state, deadline)


def in_flight_detail(decision: Refusal | None) -> str:
    assert isinstance(decision, Refusal), decision
    assert decision.code == "effect_in_flight", decision
    return decision.detail


# --- the constants, as documented ------------------------------------------------------------


def test_the_documented_timings_are_the_constants() -> None:
    assert FIRST_RETRY_S == 0.5
    assert MAX_RETRY_S == 30.0
    assert DEADLINE_MARGIN_S == 2.0


# --- next_probe_at: 0.5 s, doubling, capped at 30 s -----------------------------------------


@pytest.mark.parametrize(
    ("attempts_made", "delay"),
    [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 8.0), (6, 16.0), (7, 30.0), (40, 30.0)],
)
def test_retry_delays_are_half_a_second_doubling_up_to_thirty(
    attempts_made: int, delay: float
) -> None:
    assert next_probe_at(attempts_made, reconcile(), LONG_AGO, NOW) == NOW + delay


def test_before_any_attempt_the_delay_is_the_first_retry_not_less() -> None:
    assert next_probe_at(0, reconcile(), LONG_AGO, NOW) == NOW + 0.5


def test_the_settle_window_postpones_a_retry_measured_from_dispatch() -> None:
    # Dispatched 1 s ago with settle_s = 10: the retry waits for dispatch + 10, not now + 0.5.
    assert next_probe_at(1, reconcile(settle_s=10.0), NOW - 1.0, NOW) == NOW + 9.0


# --- check_resolvable: in flight until 2 s past the deadline ---------------------------------


def test_a_dispatching_effect_is_in_flight_up_to_two_seconds_past_its_deadline() -> None:
    deadline = NOW - 2.0
    in_flight_detail(check_resolvable(effect(deadline), NOW))
    assert check_resolvable(effect(deadline), NOW + 0.001) is None


@pytest.mark.parametrize(
    ("deadline", "wait"),
    [
        (NOW + 5.0, "7.0s"),  # 5 s to the deadline, then the 2 s margin
        (NOW - 1.5, "0.5s"),  # past the deadline, inside the margin
        (NOW - 2.0, "0.0s"),  # the last moment it is still refused
    ],
)
def test_the_in_flight_refusal_tells_the_operator_how_long_to_wait(
    deadline: float, wait: str
) -> None:
    detail = in_flight_detail(check_resolvable(effect(deadline), NOW))
    assert detail == (
        f"the effect's request may still be in flight; wait for its deadline ({wait})"
    )


# --- what the operator reads ------------------------------------------------------------------


def test_conclusions_are_recorded_under_their_documented_names() -> None:
    # The value is stored with each probe attempt, shown in an effect's history and
    # used as the probe metric's label: renaming one splits records and dashboards.
    assert [conclusion.value for conclusion in Conclusion] == [
        "committed",
        "not_committed",
        "inconclusive",
    ]


@pytest.mark.parametrize(
    ("status", "error", "at", "detail"),
    [
        (200, None, NOW, "probe answered 200: committed"),
        (404, None, NOW, "probe answered 404: not committed"),
        (
            404,
            None,
            LONG_AGO + 0.25,
            "probe answered 404, asked only 0.25s after dispatch; not believed before settle_s=2s",
        ),
        (503, None, NOW, "probe answered 503, which proves nothing"),
        (None, "connection refused", NOW, "probe failed: connection refused"),
    ],
)
def test_each_probe_verdict_says_what_the_answer_proved(
    status: int | None, error: str | None, at: float, detail: str
) -> None:
    assert judge_probe(status, error, reconcile(), LONG_AGO, at).detail == detail


@pytest.mark.parametrize(
    ("status", "at", "event", "early"),
    [
        (200, NOW, Event.PROBE_COMMITTED, False),
        (404, NOW, Event.PROBE_NOT_COMMITTED, False),
        # Only a "not found" asked inside the settle window spares an attempt.
        (404, LONG_AGO + 0.25, Event.PROBE_INCONCLUSIVE, True),
        (503, NOW, Event.PROBE_INCONCLUSIVE, False),
        (None, NOW, Event.PROBE_INCONCLUSIVE, False),
    ],
)
def test_each_verdict_is_the_lifecycle_event_it_records_and_only_an_early_one_is_early(
    status: int | None, at: float, event: Event, early: bool
) -> None:
    verdict = judge_probe(status, "refused", reconcile(), LONG_AGO, at)
    assert (verdict.event, verdict.early) == (event, early)


def test_a_settled_effect_is_refused_with_its_state() -> None:
    decision = check_resolvable(effect(LONG_AGO, EffectState.NOT_SENT), NOW)
    assert isinstance(decision, Refusal)
    assert (decision.code, decision.detail) == (
        "effect_settled",
        "the effect is already NOT_SENT",
    )
