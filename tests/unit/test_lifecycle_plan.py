"""core/lifecycle.py `plan`: what one event writes to an effect's row, its key and its
history. The stores write a plan and decide nothing; these pin each field."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.lifecycle import (
    BLOCKING,
    GAVE_UP,
    GAVE_UP_DETAIL,
    IN_FLIGHT,
    OPERATOR_DECIDES,
    PROBED,
    RECEIPTS,
    RESENT_AS,
    SETTLED,
    Event,
    Key,
    Plan,
    Record,
    asks_key_holder,
    gives_up,
    plan,
    transition,
)
from core.records import EffectRecord, EffectState, StoredResponse

NOW = 1_000_000.0
RESPONSE = StoredResponse(201, (("content-type", "text/plain"),), b"made")


def effect(
    state: EffectState = EffectState.DISPATCHING,
    key: str | None = "op-1",
    settled_by: str | None = None,
    upstream_status: int | None = None,
    finished_at: float | None = None,
    next_probe_at: float | None = None,
) -> EffectRecord:
    return EffectRecord(
        id="eff_1",
        route="put",
        resource="job:1",
        holder="w",
        epoch=3,
        idempotency_key=key,
        fingerprint="fp",
        method="PUT",
        path="/x",
        state=state,
        instance_id="i",
        created_at=NOW - 60,
        deadline=NOW - 30,
        finished_at=finished_at,
        upstream_status=upstream_status,
        reason="admitted",
        next_probe_at=next_probe_at,
        settled_by=settled_by,
    )


def planned(before: EffectRecord, event: Event, detail: str = "said so", **kw: object) -> Plan:
    found = plan(before, event, detail, **kw)  # type: ignore[arg-type]
    assert found is not None
    return found


def test_an_event_the_table_refuses_has_no_plan() -> None:
    assert plan(effect(EffectState.COMMITTED), Event.OPERATOR_COMMITTED, "no") is None


def test_a_committed_receipt_writes_its_row_and_commits_the_key_with_its_response() -> None:
    written = planned(effect(), Event.ANSWERED_COMMITTED, upstream_status=201, response=RESPONSE)
    assert written.step is transition(EffectState.DISPATCHING, Event.ANSWERED_COMMITTED)
    assert (written.moves, written.state) == (True, EffectState.COMMITTED)
    assert (written.stamps_finished, written.probe_now) == (True, False)
    assert (written.upstream_status, written.reason, written.settled_by) == (201, "said so", None)
    assert (written.key, written.response, written.key_settled_by) == (Key.COMMIT, RESPONSE, None)
    # The plain receipt is the effect's row: no history row.
    assert (written.history, written.key_holder) == (None, None)


def test_an_effect_without_a_key_leaves_keys_alone() -> None:
    written = planned(effect(key=None), Event.ANSWERED_COMMITTED, response=RESPONSE)
    assert written.key is Key.KEEP


def test_only_a_committed_answer_is_kept_and_a_key_without_one_says_who_settled_it() -> None:
    freed = planned(effect(), Event.ANSWERED_NOT_COMMITTED, upstream_status=409, response=RESPONSE)
    assert (freed.key, freed.response, freed.key_settled_by) == (Key.FREE, None, "receipt")
    probed = planned(effect(EffectState.UNKNOWN), Event.PROBE_COMMITTED, settled_by="probe")
    assert (probed.key, probed.response, probed.key_settled_by) == (Key.COMMIT, None, "probe")
    assert planned(effect(EffectState.UNKNOWN), Event.PROBE_COMMITTED).key_settled_by == "receipt"


def test_a_lost_answer_is_finished_due_for_a_probe_and_in_the_history() -> None:
    written = planned(effect(), Event.LOST, upstream_status=504)
    assert (written.state, written.moves) == (EffectState.UNKNOWN, True)
    # A receipt: finished now though UNKNOWN still blocks.
    assert (written.stamps_finished, written.probe_now) == (True, True)
    assert (written.upstream_status, written.history) == (504, "unknown")


def test_a_sweep_keeps_the_upstream_status_and_finishes_nothing() -> None:
    before = effect(upstream_status=599, finished_at=NOW - 1)
    written = planned(before, Event.PAST_DEADLINE, upstream_status=1, settled_by="sweep")
    assert (written.state, written.stamps_finished, written.probe_now) == (
        EffectState.UNKNOWN,
        False,
        True,
    )
    assert (written.upstream_status, written.settled_by, written.history) == (
        599,
        "sweep",
        "unknown",
    )
    after = written.effect_after(before, NOW)
    assert (after.finished_at, after.next_probe_at) == (NOW - 1, NOW)


def test_a_probe_that_settles_is_finished_by_settling_and_recorded() -> None:
    before = effect(EffectState.UNKNOWN, upstream_status=504, next_probe_at=NOW - 5)
    written = planned(before, Event.PROBE_COMMITTED, upstream_status=200, settled_by="probe")
    assert (written.stamps_finished, written.probe_now, written.upstream_status) == (
        True,
        False,
        504,
    )
    assert (written.settled_by, written.history) == ("probe", "committed")
    after = written.effect_after(before, NOW)
    assert after == replace(
        before,
        state=EffectState.COMMITTED,
        finished_at=NOW,
        reason="said so",
        settled_by="probe",
        next_probe_at=None,
    )


def test_an_inconclusive_probe_moves_nothing_and_is_history() -> None:
    before = effect(EffectState.UNKNOWN, next_probe_at=NOW + 5)
    written = planned(before, Event.PROBE_INCONCLUSIVE, settled_by="probe")
    assert (written.moves, written.history, written.key) == (False, "inconclusive", Key.KEEP)
    assert written.effect_after(before, NOW) is before


def test_a_probes_own_conclusion_is_the_history_word() -> None:
    written = planned(effect(EffectState.UNKNOWN), Event.PROBE_INCONCLUSIVE, conclusion="early")
    assert written.history == "early"


def test_a_late_event_is_audited_with_what_the_effect_already_was() -> None:
    before = effect(EffectState.COMMITTED, settled_by="probe")
    written = planned(before, Event.PROBE_COMMITTED, settled_by="probe:2")
    assert written.reason == "said so (the effect was already COMMITTED; nothing changed)"
    assert (written.moves, written.history, written.settled_by) == (False, "late", "probe")
    assert (written.key, written.key_holder) == (Key.KEEP, None)


def test_a_conflict_says_who_settled_it_and_who_holds_its_key_now() -> None:
    before = effect(EffectState.COMMITTED, settled_by="probe", upstream_status=200)
    written = planned(
        before, Event.ANSWERED_NOT_COMMITTED, upstream_status=409, key_record_holder="eff_2"
    )
    assert written.reason == (
        "conflicting evidence: said so; the effect was COMMITTED (settled by probe); "
        "its key is now held by eff_2"
    )
    assert (written.state, written.key, written.history) == (
        EffectState.CONFLICTING,
        Key.HOLD,
        "conflict",
    )
    assert (written.key_holder, written.stamps_finished, written.upstream_status) == (
        "eff_2",
        True,
        409,
    )
    assert written.settled_by == "probe"  # a conflict settles nothing


def test_a_conflict_whose_key_is_its_own_names_no_holder() -> None:
    before = effect(EffectState.NOT_COMMITTED, upstream_status=404)
    written = planned(before, Event.PROBE_COMMITTED, key_record_holder="eff_1")
    assert written.key_holder is None
    assert written.reason == (
        "conflicting evidence: said so; the effect was NOT_COMMITTED (settled by its receipt)"
    )
    # Not a receipt, and CONFLICTING blocks: finished_at and the status stay.
    assert (written.stamps_finished, written.upstream_status) == (False, 404)


def test_a_stale_sweep_writes_nothing_at_all() -> None:
    written = planned(effect(EffectState.UNKNOWN), Event.PAST_DEADLINE)
    assert (written.moves, written.history, written.key) == (False, None, Key.KEEP)


def test_a_receipt_that_settles_an_unknown_effect_is_plain_and_a_lost_one_late() -> None:
    assert planned(effect(EffectState.UNKNOWN), Event.ANSWERED_COMMITTED).history is None
    assert planned(effect(EffectState.UNKNOWN), Event.LOST).history == "late"


def test_only_a_conflict_on_a_keyed_effect_asks_who_holds_its_key() -> None:
    assert asks_key_holder(effect(EffectState.COMMITTED), Event.ANSWERED_NOT_COMMITTED)
    assert not asks_key_holder(effect(EffectState.COMMITTED, key=None), Event.NOT_SENT)
    assert not asks_key_holder(effect(EffectState.COMMITTED), Event.ANSWERED_COMMITTED)
    assert not asks_key_holder(effect(EffectState.COMMITTED), Event.OPERATOR_COMMITTED)


@pytest.mark.parametrize(
    ("event", "counted", "next_at", "expected"),
    [
        (Event.PROBE_INCONCLUSIVE, True, None, True),
        (Event.PROBE_INCONCLUSIVE, True, NOW, False),
        (Event.PROBE_INCONCLUSIVE, False, None, False),
        (Event.PROBE_NOT_COMMITTED, True, None, False),
    ],
)
def test_a_probe_gives_up_only_inconclusive_counted_and_with_no_next_attempt(
    event: Event, counted: bool, next_at: float | None, expected: bool
) -> None:
    assert gives_up(event, counted, next_at) is expected


def test_the_state_sets_follow_the_table() -> None:
    assert {EffectState.COMMITTED, EffectState.NOT_COMMITTED, EffectState.NOT_SENT} == SETTLED
    assert set(EffectState) == SETTLED | BLOCKING
    swept = {state: transition(state, Event.PAST_DEADLINE) for state in EffectState}
    assert {state for state, step in swept.items() if step and step.next != state} == IN_FLIGHT
    probed = {state: transition(state, Event.PROBE_INCONCLUSIVE) for state in EffectState}
    assert {
        state for state, step in probed.items() if step and step.record is Record.SETTLED
    } == PROBED
    # The history word the admin API shows, and a detail that says who acts next.
    assert GAVE_UP == "gave_up"
    assert "an operator must resolve" in GAVE_UP_DETAIL


@pytest.mark.parametrize("event", sorted(RECEIPTS))
def test_a_resends_definite_answer_settles_what_it_resent_as_it_settles_itself(
    event: Event,
) -> None:
    own = transition(EffectState.DISPATCHING, event)
    assert own is not None
    definite = own.next in (EffectState.COMMITTED, EffectState.NOT_COMMITTED)
    if not definite:  # not sent, or lost: nothing about the earlier sends
        assert event not in RESENT_AS
        return
    resent = transition(EffectState.UNKNOWN, RESENT_AS[event])
    assert resent is not None and resent.next is own.next


@pytest.mark.parametrize("outcome", sorted(OPERATOR_DECIDES))
def test_an_operators_decision_settles_the_outcome_decided(outcome: EffectState) -> None:
    decided = transition(EffectState.UNKNOWN, OPERATOR_DECIDES[outcome])
    assert decided is not None and decided.next is outcome
