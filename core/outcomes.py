"""What a dispatch attempt proves about an effect.

Only an answer from the upstream, classified by the route's status rules, can
show that a write did or did not take effect. A timeout or a dropped connection
after the request left proves nothing: the write may still land, so the effect
is UNKNOWN and its resource stays blocked until someone knows.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.frozen import quick_init
from core.lifecycle import Event
from policies import Outcome, StatusRules


@quick_init
@dataclass(frozen=True)
class Answered:
    status: int


@dataclass(frozen=True)
class NotSent:
    """Connecting (the TLS handshake included) failed: not one byte of the request left."""

    reason: str


@dataclass(frozen=True)
class TooLateToSend(NotSent):
    """Connected, but the send deadline (core/send_deadline.py) had passed: the proxy
    wrote not one byte, on purpose."""


@dataclass(frozen=True)
class Lost:
    """The request may have left, and no usable answer came back."""

    reason: str


DispatchResult = Answered | NotSent | Lost

_EVENT_BY_OUTCOME = {
    Outcome.COMMITTED: Event.ANSWERED_COMMITTED,
    Outcome.NOT_COMMITTED: Event.ANSWERED_NOT_COMMITTED,
    Outcome.UNKNOWN: Event.LOST,
}


def receipt_event(result: DispatchResult, rules: StatusRules) -> tuple[Event, str]:
    """The lifecycle event one dispatch produced, and the reason recorded with it."""
    if isinstance(result, Answered):
        outcome = rules.classify(result.status)
        return _EVENT_BY_OUTCOME[outcome], f"upstream answered {result.status} ({outcome.value})"
    if isinstance(result, NotSent):
        return Event.NOT_SENT, f"not sent: {result.reason}"
    return Event.LOST, f"outcome unknown: {result.reason}"
