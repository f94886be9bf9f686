"""core/lifecycle.py: the table's rules, and the docs' copy of it.

docs/explanation/lifecycle.md shows the whole table; `test_the_docs_show_this_table`
renders it from the module and compares, so the documentation cannot drift from the code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core.lifecycle import (
    BLOCKING,
    RECEIPTS,
    RESOLVABLE,
    TABLE,
    Answer,
    Event,
    Key,
    Record,
    key_heir,
    transition,
)
from core.records import EffectState

LIFECYCLE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "explanation" / "lifecycle.md"
SETTLED = (EffectState.COMMITTED, EffectState.NOT_COMMITTED, EffectState.NOT_SENT)
# What each kind of evidence claims about the upstream (None: nothing).
CLAIMS: dict[Event, bool | None] = {
    Event.ANSWERED_COMMITTED: True,
    Event.ANSWERED_NOT_COMMITTED: False,
    Event.NOT_SENT: False,
    Event.LOST: None,
    Event.PAST_DEADLINE: None,
    Event.RESTARTED: None,
    Event.PROBE_COMMITTED: True,
    Event.PROBE_NOT_COMMITTED: False,
    Event.PROBE_INCONCLUSIVE: None,
    Event.RESEND_COMMITTED: True,
    Event.RESEND_NOT_COMMITTED: False,
    Event.OPERATOR_COMMITTED: True,
    Event.OPERATOR_NOT_COMMITTED: False,
}


def test_the_table_has_every_state_and_event() -> None:
    assert set(TABLE) == {(state, event) for state in EffectState for event in Event}


@pytest.mark.parametrize("state", SETTLED)
@pytest.mark.parametrize("event", list(Event))
def test_evidence_about_a_settled_effect_is_history_or_a_conflict(
    state: EffectState, event: Event
) -> None:
    step = transition(state, event)
    claim = CLAIMS[event]
    if event in (Event.OPERATOR_COMMITTED, Event.OPERATOR_NOT_COMMITTED):
        assert step is None  # effect_settled: only a conflict goes back to an operator
        return
    assert step is not None
    if claim is None:
        assert step.next is state and step.key is Key.KEEP
        assert step.record in (Record.LATE, Record.NOTHING)
        return
    agrees = (state is EffectState.COMMITTED) == claim
    if agrees:
        assert (step.next, step.key, step.record) == (state, Key.KEEP, Record.LATE)
    else:
        assert (step.next, step.key, step.record) == (
            EffectState.CONFLICTING,
            Key.HOLD,
            Record.CONFLICT,
        )


@pytest.mark.parametrize("event", list(Event))
def test_only_an_operator_moves_a_conflicting_effect(event: Event) -> None:
    step = transition(EffectState.CONFLICTING, event)
    assert step is not None
    if event is Event.OPERATOR_COMMITTED:
        assert (step.next, step.key) == (EffectState.COMMITTED, Key.COMMIT)
    elif event is Event.OPERATOR_NOT_COMMITTED:
        assert (step.next, step.key) == (EffectState.NOT_COMMITTED, Key.FREE)
    else:
        assert (step.next, step.key) == (EffectState.CONFLICTING, Key.KEEP)


def test_no_step_frees_a_key_unless_it_settles_not_committed_or_not_sent() -> None:
    for (state, event), step in TABLE.items():
        if step is not None and step.key is Key.FREE:
            assert step.next in (EffectState.NOT_COMMITTED, EffectState.NOT_SENT), (state, event)
            assert state in (EffectState.DISPATCHING, EffectState.UNKNOWN, EffectState.CONFLICTING)


def test_a_conflict_never_frees_replays_or_reopens() -> None:
    for (state, event), step in TABLE.items():
        if step is not None and step.record is Record.CONFLICT:
            assert step.next is EffectState.CONFLICTING, (state, event)
            assert step.key is Key.HOLD
            assert not step.store_response
            assert step.next in BLOCKING


def test_a_timeout_is_never_proof_of_failure() -> None:
    for state in (EffectState.DISPATCHING, EffectState.UNKNOWN):
        for event in (Event.LOST, Event.PAST_DEADLINE, Event.RESTARTED):
            step = transition(state, event)
            assert step is not None and step.next is EffectState.UNKNOWN
            assert step.key is Key.KEEP


def test_only_the_upstreams_own_committed_answer_is_kept_for_replays() -> None:
    stored = {pair for pair, step in TABLE.items() if step is not None and step.store_response}
    assert stored == {
        (EffectState.DISPATCHING, Event.ANSWERED_COMMITTED),
        (EffectState.UNKNOWN, Event.ANSWERED_COMMITTED),
    }


def test_every_receipt_has_an_answer_and_nothing_else_does() -> None:
    for (state, event), step in TABLE.items():
        assert step is not None or event not in RECEIPTS, (state, event)
        if step is not None:
            assert (step.answer is not None) == (event in RECEIPTS), (state, event)


def test_nothing_was_sent_is_said_only_for_not_sent() -> None:
    for (state, event), step in TABLE.items():
        if step is not None and step.answer is Answer.NOT_SENT:
            assert event is Event.NOT_SENT, (state, event)


def test_the_history_words_are_the_ones_the_admin_api_shows() -> None:
    # Stored as each event's `conclusion`: operators and their scripts read them.
    assert [record.value for record in Record] == ["settled", "late", "conflict", "nothing"]


def test_a_freed_key_passes_to_the_earliest_other_open_effect_under_it() -> None:
    # The first send settles NOT_COMMITTED while its resends are open.
    assert key_heir("eff_1", ["eff_1", "eff_2", "eff_3"]) == "eff_2"
    assert key_heir("eff_2", ["eff_1", "eff_2"]) == "eff_1"
    assert key_heir("eff_1", ["eff_1"]) is None
    assert key_heir("eff_1", []) is None


def test_resolvable_states() -> None:
    assert {EffectState.DISPATCHING, EffectState.UNKNOWN, EffectState.CONFLICTING} == RESOLVABLE
    assert BLOCKING == RESOLVABLE


# --- the docs' copy --------------------------------------------------------------------------


def _cell(state: EffectState, event: Event) -> str:
    step = transition(state, event)
    if step is None:
        return "refused"
    if step.record is Record.NOTHING:
        return "—"
    if step.record is Record.LATE:
        return "history"
    key = {Key.COMMIT: ", replays", Key.FREE: ", key freed", Key.HOLD: ", key held"}
    if step.next is state:
        return "stays"
    return f"**{step.next.value}**{key.get(step.key, '')}"


ANSWERS = {
    Answer.RESPONSE: "upstream's response",
    Answer.NOT_SENT: "502",
    Answer.UNKNOWN: "504",
    Answer.SETTLED: "what was settled",
    Answer.CONFLICT: "409 conflict",
}


def render_transitions() -> str:
    states = list(EffectState)
    lines = [
        "| event \\ state | " + " | ".join(f"`{s.value}`" for s in states) + " |",
        "|---|" + "---|" * len(states),
    ]
    for event in Event:
        cells = [_cell(state, event) for state in states]
        lines.append(f"| `{event.value}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_answers() -> str:
    states = list(EffectState)
    lines = [
        "| receipt \\ state | " + " | ".join(f"`{s.value}`" for s in states) + " |",
        "|---|" + "---|" * len(states),
    ]
    for event in Event:
        if event not in RECEIPTS:
            continue
        cells = []
        for state in states:
            step = transition(state, event)
            assert step is not None and step.answer is not None
            cells.append(ANSWERS[step.answer])
        lines.append(f"| `{event.value}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def test_the_docs_show_this_table() -> None:
    text = LIFECYCLE_PAGE.read_text(encoding="utf-8")
    assert render_transitions() in text, "the lifecycle table:\n" + render_transitions()
    assert render_answers() in text, "the receipt answers:\n" + render_answers()


if __name__ == "__main__":  # prints both tables, to paste into docs/explanation/lifecycle.md
    print(render_transitions(), render_answers(), sep="\n\n")
