"""Reconciliation rules as pure functions: what a probe answer proves, and when to
ask again (when an operator may decide is core/lifecycle.py's `check_resolvable`).

A "not committed" answer is believed only once the settle window has passed
since dispatch: a slow upstream may still be applying the write, and a lookup
that runs before it lands would wrongly free the key for a second send.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from core.lifecycle import Event
from policies import Outcome, Reconcile

FIRST_RETRY_S = 0.5
MAX_RETRY_S = 30.0


class Conclusion(StrEnum):
    COMMITTED = "committed"
    NOT_COMMITTED = "not_committed"
    INCONCLUSIVE = "inconclusive"


_EVENT_BY_CONCLUSION = {
    Conclusion.COMMITTED: Event.PROBE_COMMITTED,
    Conclusion.NOT_COMMITTED: Event.PROBE_NOT_COMMITTED,
    Conclusion.INCONCLUSIVE: Event.PROBE_INCONCLUSIVE,
}


@dataclass(frozen=True)
class Verdict:
    conclusion: Conclusion
    detail: str
    # An early "not committed", inside the settle window: it does not use up an attempt,
    # so that `attempts: 1` still gets its one probe after the window.
    early: bool = False

    @property
    def event(self) -> Event:
        return _EVENT_BY_CONCLUSION[self.conclusion]


def judge_probe(
    status: int | None,
    error: str | None,
    reconcile: Reconcile,
    dispatched_at: float,
    asked_at: float,
) -> Verdict:
    """What an answer proves. The settle window is judged at the time the probe was
    *asked*: a "not found" asked inside the window proves nothing, however late it
    arrives, because the write may have landed between the lookup and the answer."""
    if status is None:
        return Verdict(Conclusion.INCONCLUSIVE, f"probe failed: {error}")
    outcome = reconcile.rules.classify(status)
    if outcome is Outcome.COMMITTED:
        return Verdict(Conclusion.COMMITTED, f"probe answered {status}: committed")
    if outcome is Outcome.NOT_COMMITTED:
        waited = asked_at - dispatched_at
        if waited < reconcile.settle_s:
            return Verdict(
                Conclusion.INCONCLUSIVE,
                f"probe answered {status}, asked only {waited:.2f}s after dispatch; "
                f"not believed before settle_s={reconcile.settle_s:g}s",
                early=True,
            )
        return Verdict(Conclusion.NOT_COMMITTED, f"probe answered {status}: not committed")
    return Verdict(Conclusion.INCONCLUSIVE, f"probe answered {status}, which proves nothing")


def next_probe_at(
    attempts_made: int, reconcile: Reconcile, dispatched_at: float, now: float
) -> float | None:
    """When to probe again after an inconclusive answer; None once attempts are used up."""
    if attempts_made >= reconcile.attempts:
        return None
    backoff = min(FIRST_RETRY_S * 2.0 ** max(attempts_made - 1, 0), MAX_RETRY_S)
    return max(now + backoff, dispatched_at + reconcile.settle_s)
