"""What a dispatch attempt proves about an effect.

Only an answer from the upstream, classified by the route's status rules, can
show that a write did or did not take effect. A timeout or a dropped connection
after the request left proves nothing: the write may still land, so the effect
is UNKNOWN and its resource stays blocked until someone knows.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.records import EffectState
from policies import Outcome, StatusRules


@dataclass(frozen=True)
class Answered:
    status: int


@dataclass(frozen=True)
class NotSent:
    """The connection was never established: not one byte of the request left."""

    reason: str


@dataclass(frozen=True)
class Lost:
    """The request may have left, and no usable answer came back."""

    reason: str


DispatchResult = Answered | NotSent | Lost

_STATE_BY_OUTCOME = {
    Outcome.COMMITTED: EffectState.COMMITTED,
    Outcome.NOT_COMMITTED: EffectState.NOT_COMMITTED,
    Outcome.UNKNOWN: EffectState.UNKNOWN,
}


def settle_dispatch(result: DispatchResult, rules: StatusRules) -> tuple[EffectState, str]:
    """The effect's state after one dispatch, and the reason recorded with it."""
    if isinstance(result, Answered):
        outcome = rules.classify(result.status)
        return _STATE_BY_OUTCOME[outcome], f"upstream answered {result.status} ({outcome.value})"
    if isinstance(result, NotSent):
        return EffectState.NOT_SENT, f"not sent: {result.reason}"
    return EffectState.UNKNOWN, f"outcome unknown: {result.reason}"
