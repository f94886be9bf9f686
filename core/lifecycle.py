"""The life of an effect, as one table: (state, event) → what happens.

In the style of h11's `_state.py`: no I/O, no clock. The stores apply these
transitions inside their transactions; everything else asks this module.

An effect is born DISPATCHING when a fenced request is admitted. Evidence about
what the upstream did arrives as events: the dispatch's own answer (or its
failure), a sweep or restart that finds the request can no longer be in flight,
a probe, a resend of the same operation, an operator's decision.

Two rules shape the table:

* **An event that finds the effect no longer in the state it expects changes
  nothing but the audit trail.** A receipt that arrives after a probe settled the
  effect, a probe answer that arrives after an operator decided: recorded, never
  acted on.
* **Evidence that contradicts a settled state is a conflict**, never silently
  dropped and never acted on: the effect becomes CONFLICTING, which blocks its
  resource until an operator resolves it. A conflict never frees a key, never
  replays a response nobody saw and never re-opens a resource.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum, StrEnum, auto

from core.codes import ErrorCode
from core.records import EffectState, Refusal

DISPATCHING = EffectState.DISPATCHING
UNKNOWN = EffectState.UNKNOWN
COMMITTED = EffectState.COMMITTED
NOT_COMMITTED = EffectState.NOT_COMMITTED
NOT_SENT = EffectState.NOT_SENT
CONFLICTING = EffectState.CONFLICTING


class Event(StrEnum):
    # The dispatch's own receipt.
    ANSWERED_COMMITTED = "answered_committed"  # upstream status mapped `committed`
    ANSWERED_NOT_COMMITTED = "answered_not_committed"  # mapped `not_committed`
    NOT_SENT = "not_sent"  # not one byte of the request left
    LOST = "lost"  # it may have left; no usable answer (timeout, reset, `unknown` status)
    # The request can no longer be in flight, and nobody recorded its fate.
    PAST_DEADLINE = "past_deadline"  # a sweep, any replica
    RESTARTED = "restarted"  # the instance that dispatched it started again
    # What a probe of the upstream proved.
    PROBE_COMMITTED = "probe_committed"
    PROBE_NOT_COMMITTED = "probe_not_committed"
    PROBE_INCONCLUSIVE = "probe_inconclusive"
    # A resend of the same operation (upstream_idempotent routes) was answered.
    RESEND_COMMITTED = "resend_committed"
    RESEND_NOT_COMMITTED = "resend_not_committed"
    # An operator's decision.
    OPERATOR_COMMITTED = "operator_committed"
    OPERATOR_NOT_COMMITTED = "operator_not_committed"


RECEIPTS = frozenset(
    {Event.ANSWERED_COMMITTED, Event.ANSWERED_NOT_COMMITTED, Event.NOT_SENT, Event.LOST}
)


class Key(Enum):
    """What happens to the operation's idempotency key."""

    KEEP = auto()
    # Nothing took effect: the holder may send the operation again. Only the key's own
    # record is let go, and only to the key's next owner if it has one (`key_heir`); a
    # key another effect holds now is left alone.
    FREE = auto()
    # It took effect: the key replays from now on (the response, if one was seen) and is
    # never sent again; its retention starts now.
    COMMIT = auto()
    # Contradicting evidence: if the key was freed, take it back, so that nothing can be
    # sent under it until an operator has decided.
    HOLD = auto()


class Record(StrEnum):
    """How the event is written in the effect's history (the value is stored as the
    event's conclusion, so it is part of the admin API's answers)."""

    SETTLED = "settled"  # it moved the effect
    LATE = "late"  # it found the effect past the state it expected; nothing changed
    CONFLICT = "conflict"  # it contradicts the settled state
    # A sweep or restart that finds the effect already out of DISPATCHING: it says
    # nothing about the upstream (another replica's sweep or the receipt came first).
    NOTHING = "nothing"


class Answer(Enum):
    """What the worker whose dispatch this was is told (receipt events only)."""

    RESPONSE = auto()  # the upstream's own response
    NOT_SENT = auto()  # 502 upstream_unreachable: nothing was sent
    UNKNOWN = auto()  # 504 outcome_unknown: the resource is blocked
    SETTLED = auto()  # what reconciliation established before the answer came
    CONFLICT = auto()  # 409 conflicting_evidence: an operator must resolve it


@dataclass(frozen=True)
class Transition:
    next: EffectState
    key: Key
    record: Record
    answer: Answer | None = None  # set for receipt events
    store_response: bool = False  # the upstream's response is kept for replays


def _settle(to: EffectState, answer: Answer | None = None) -> Transition:
    key = {COMMITTED: Key.COMMIT, NOT_COMMITTED: Key.FREE, NOT_SENT: Key.FREE}.get(to, Key.KEEP)
    kept = to is COMMITTED and answer is Answer.RESPONSE
    return Transition(to, key, Record.SETTLED, answer, store_response=kept)


def _late(state: EffectState, answer: Answer | None = None) -> Transition:
    return Transition(state, Key.KEEP, Record.LATE, answer)


def _stale_sweep(state: EffectState) -> Transition:
    return Transition(state, Key.KEEP, Record.NOTHING)


def _conflict(answer: Answer | None = None) -> Transition:
    return Transition(CONFLICTING, Key.HOLD, Record.CONFLICT, answer)


def _late_or_conflict(
    settled: EffectState, says_committed: bool, answer: Answer | None = None
) -> Transition:
    """A settled effect met more evidence: agreeing is an audit entry, contradicting a
    conflict. Only a definite claim is weighed; `None` claims nothing."""
    agrees = (settled is COMMITTED) == says_committed
    return _late(settled, answer) if agrees else _conflict(Answer.CONFLICT if answer else None)


_E = Event
_R = Answer

TABLE: dict[tuple[EffectState, Event], Transition | None] = {}

# DISPATCHING: the request is (or may be) on its way; its receipt is expected.
TABLE.update(
    {
        (DISPATCHING, _E.ANSWERED_COMMITTED): _settle(COMMITTED, _R.RESPONSE),
        (DISPATCHING, _E.ANSWERED_NOT_COMMITTED): _settle(NOT_COMMITTED, _R.RESPONSE),
        (DISPATCHING, _E.NOT_SENT): _settle(NOT_SENT, _R.NOT_SENT),
        (DISPATCHING, _E.LOST): Transition(UNKNOWN, Key.KEEP, Record.SETTLED, _R.UNKNOWN),
        (DISPATCHING, _E.PAST_DEADLINE): Transition(UNKNOWN, Key.KEEP, Record.SETTLED),
        (DISPATCHING, _E.RESTARTED): Transition(UNKNOWN, Key.KEEP, Record.SETTLED),
        # Probes and resends work on UNKNOWN effects; one that meets a DISPATCHING
        # effect cannot be about it yet.
        (DISPATCHING, _E.PROBE_COMMITTED): _late(DISPATCHING),
        (DISPATCHING, _E.PROBE_NOT_COMMITTED): _late(DISPATCHING),
        (DISPATCHING, _E.PROBE_INCONCLUSIVE): _late(DISPATCHING),
        (DISPATCHING, _E.RESEND_COMMITTED): _late(DISPATCHING),
        (DISPATCHING, _E.RESEND_NOT_COMMITTED): _late(DISPATCHING),
        # Only once it cannot be in flight any more (see `check_resolvable`).
        (DISPATCHING, _E.OPERATOR_COMMITTED): _settle(COMMITTED),
        (DISPATCHING, _E.OPERATOR_NOT_COMMITTED): _settle(NOT_COMMITTED),
    }
)

# UNKNOWN: sent, fate not known. Any definite evidence settles it; a late receipt from
# a stalled proxy is the upstream's own answer, the best evidence there is.
TABLE.update(
    {
        (UNKNOWN, _E.ANSWERED_COMMITTED): _settle(COMMITTED, _R.RESPONSE),
        (UNKNOWN, _E.ANSWERED_NOT_COMMITTED): _settle(NOT_COMMITTED, _R.RESPONSE),
        (UNKNOWN, _E.NOT_SENT): _settle(NOT_SENT, _R.NOT_SENT),
        (UNKNOWN, _E.LOST): _late(UNKNOWN, _R.UNKNOWN),
        (UNKNOWN, _E.PAST_DEADLINE): _stale_sweep(UNKNOWN),
        (UNKNOWN, _E.RESTARTED): _stale_sweep(UNKNOWN),
        (UNKNOWN, _E.PROBE_COMMITTED): _settle(COMMITTED),
        (UNKNOWN, _E.PROBE_NOT_COMMITTED): _settle(NOT_COMMITTED),
        (UNKNOWN, _E.PROBE_INCONCLUSIVE): Transition(UNKNOWN, Key.KEEP, Record.SETTLED),
        (UNKNOWN, _E.RESEND_COMMITTED): _settle(COMMITTED),
        (UNKNOWN, _E.RESEND_NOT_COMMITTED): _settle(NOT_COMMITTED),
        (UNKNOWN, _E.OPERATOR_COMMITTED): _settle(COMMITTED),
        (UNKNOWN, _E.OPERATOR_NOT_COMMITTED): _settle(NOT_COMMITTED),
    }
)

# Settled states: more evidence is audited when it agrees, a conflict when it does not.
# An operator cannot overrule a settled effect (`effect_settled`); only a conflict
# hands the decision back to one.
for _settled in (COMMITTED, NOT_COMMITTED, NOT_SENT):
    TABLE.update(
        {
            (_settled, _E.ANSWERED_COMMITTED): _late_or_conflict(_settled, True, _R.RESPONSE),
            (_settled, _E.ANSWERED_NOT_COMMITTED): _late_or_conflict(_settled, False, _R.RESPONSE),
            (_settled, _E.NOT_SENT): _late_or_conflict(_settled, False, _R.NOT_SENT),
            # A lost answer claims nothing: the worker learns what was established.
            (_settled, _E.LOST): _late(_settled, _R.SETTLED),
            (_settled, _E.PAST_DEADLINE): _stale_sweep(_settled),
            (_settled, _E.RESTARTED): _stale_sweep(_settled),
            (_settled, _E.PROBE_COMMITTED): _late_or_conflict(_settled, True),
            (_settled, _E.PROBE_NOT_COMMITTED): _late_or_conflict(_settled, False),
            (_settled, _E.PROBE_INCONCLUSIVE): _late(_settled),
            (_settled, _E.RESEND_COMMITTED): _late_or_conflict(_settled, True),
            (_settled, _E.RESEND_NOT_COMMITTED): _late_or_conflict(_settled, False),
            (_settled, _E.OPERATOR_COMMITTED): None,
            (_settled, _E.OPERATOR_NOT_COMMITTED): None,
        }
    )

# CONFLICTING: evidence disagrees; only an operator decides. Everything else is audited.
for _event in Event:
    TABLE[(CONFLICTING, _event)] = _late(CONFLICTING, _R.CONFLICT if _event in RECEIPTS else None)
TABLE[(CONFLICTING, _E.OPERATOR_COMMITTED)] = _settle(COMMITTED)
TABLE[(CONFLICTING, _E.OPERATOR_NOT_COMMITTED)] = _settle(NOT_COMMITTED)

del _settled, _event


def transition(state: EffectState, event: Event) -> Transition | None:
    """What `event` does to an effect in `state`; None: not allowed (refused)."""
    return TABLE[(state, event)]


# States whose effects block their resource: a write may have landed, or may still.
BLOCKING = frozenset({DISPATCHING, UNKNOWN, CONFLICTING})
# States an operator may settle (DISPATCHING only once it cannot be in flight).
RESOLVABLE = frozenset(
    state for state in EffectState if transition(state, Event.OPERATOR_COMMITTED) is not None
)


def key_heir(freed: str, open_under_key: Iterable[str]) -> str | None:
    """Who holds an operation's key once the effect `freed` lets it go (Key.FREE), of the
    effects under the same (resource, key) that are open (BLOCKING), in admission order.

    The key belongs to whichever effect under it is still open: a resend on its way
    when a probe settles the first send NOT_COMMITTED, an earlier send in dispute. That
    effect may yet commit, so its key must keep refusing and, once it commits,
    replaying; the earliest admitted takes it (a resend leaves the key with the send it
    resends). None: no effect under the key is open, and the key is free."""
    return next((effect for effect in open_under_key if effect != freed), None)


# --- reconciliation: what waits for it, and what a probe may be asked about ---------------

# "Blocked resources" of the in-doubt listing: those waiting for a probe or an operator.
# A request merely in flight blocks a successor too, but waits for nobody; the
# fenceproxy_blocked_resources gauge counts the same set.
AWAITING_RECONCILIATION = frozenset({UNKNOWN, CONFLICTING})


def probe_refusal(effect_id: str, state: EffectState) -> Refusal | None:
    """Why an effect in `state` is not probed on an operator's demand; None: it is.

    Only an UNKNOWN effect waits for the upstream's word. A request still in flight may
    yet land; a settled effect is not asked about again; a CONFLICTING one already has
    contradicting evidence, and more of it cannot settle it: an operator must."""
    context = {"effect_id": effect_id, "state": state.value}
    if state is UNKNOWN:
        return None
    if state is DISPATCHING:
        return Refusal(
            ErrorCode.EFFECT_IN_FLIGHT,
            f"the effect is {state} and its request may still be in flight; "
            "only an UNKNOWN effect is probed",
            context,
        )
    if state is CONFLICTING:
        return Refusal(
            ErrorCode.CONFLICTING_EVIDENCE,
            f"the effect is {state}: its evidence already disagrees and only an operator "
            "resolves it; only an UNKNOWN effect is probed",
            context,
        )
    return Refusal(
        ErrorCode.EFFECT_SETTLED,
        f"the effect is already {state}; only an UNKNOWN effect is probed",
        context,
    )
