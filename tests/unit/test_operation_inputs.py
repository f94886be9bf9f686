"""The rules of proxy/operations.py that need no store: what an operator or a client may
send (resource names, reasons, limits, states, outcomes). The admin API and the CLI
both refuse through these (see tests/integration/app/test_operations.py for the two
side by side)."""

from __future__ import annotations

import pytest

from core.codes import ErrorCode
from core.records import EffectState, Refusal
from proxy.operations import (
    DEFAULT_LIST_LIMIT,
    MAX_LIST_LIMIT,
    MAX_TEXT_CHARS,
    effect_state,
    list_limit,
    outcome,
    required_text,
    resource_name,
)


def invalid_request(error: pytest.ExceptionInfo[Refusal]) -> Refusal:
    assert error.value.code is ErrorCode.INVALID_REQUEST
    return error.value


# --- resource names -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["r", "supplier:widget", "a.b_c:d@e/f+g=h-i", "A" * 256, "0"],
)
def test_valid_resource_names_are_returned(value: str) -> None:
    assert resource_name(value) == value


@pytest.mark.parametrize(
    "value",
    ["", "A" * 257, "has space", "tab\t", "supplier:widget\n", "ümlaut", "a?b", "a#b", "a%2F"],
)
def test_bad_resource_names_are_invalid_request(value: str) -> None:
    with pytest.raises(Refusal) as error:
        resource_name(value)
    detail = invalid_request(error).detail
    assert "is not a valid resource name" in detail
    assert "resource must be 1-256 characters" in detail


@pytest.mark.parametrize("value", [None, 42, ["r"], {"r": 1}, b"r"])
def test_non_string_resource_is_invalid_request(value: object) -> None:
    with pytest.raises(Refusal) as error:
        resource_name(value)
    assert invalid_request(error).detail.startswith("resource must be 1-256 characters")


def test_a_refusal_repeats_only_the_start_of_a_long_bad_name() -> None:
    with pytest.raises(Refusal) as error:
        resource_name("x" * 10_000 + " ")
    assert len(invalid_request(error).detail) < 200


# --- reasons and operators -------------------------------------------------------------------


def test_text_is_kept_without_surrounding_space() -> None:
    assert required_text("  found in the portal \n", "reason") == "found in the portal"


@pytest.mark.parametrize("value", ["", "   ", "\n\t"])
def test_empty_text_is_refused(value: str) -> None:
    with pytest.raises(Refusal) as error:
        required_text(value, "reason")
    assert invalid_request(error).detail == "reason must not be empty"


def test_text_up_to_the_limit_is_kept_and_one_more_character_is_refused() -> None:
    assert required_text("r" * MAX_TEXT_CHARS, "operator") == "r" * MAX_TEXT_CHARS
    with pytest.raises(Refusal) as error:
        required_text("r" * (MAX_TEXT_CHARS + 1), "operator")
    assert invalid_request(error).detail == f"operator must be at most {MAX_TEXT_CHARS} characters"


@pytest.mark.parametrize("value", [None, 7, ["r"], {"r": 1}])
def test_text_that_is_not_a_string_is_refused(value: object) -> None:
    with pytest.raises(Refusal) as error:
        required_text(value, "reason")
    assert invalid_request(error).detail == "reason must be a string"


# --- list limits -----------------------------------------------------------------------------


def test_no_limit_is_the_default() -> None:
    assert list_limit(None) == DEFAULT_LIST_LIMIT


@pytest.mark.parametrize("raw", ["1", "50", str(MAX_LIST_LIMIT), "007"])
def test_whole_numbers_in_range_are_limits(raw: str) -> None:
    assert list_limit(raw) == int(raw)


@pytest.mark.parametrize(
    "raw", ["0", "-1", "ten", str(MAX_LIST_LIMIT + 1), "1.5", "", " 5", "\u00b2", "\u0661"]
)
def test_other_limits_are_refused(raw: str) -> None:
    # "\u00b2" (superscript two) passes str.isdigit() and then fails int(); "\u0661"
    # (Arabic-Indic one) passes both: neither is a limit anyone typed on purpose.
    with pytest.raises(Refusal) as error:
        list_limit(raw)
    assert invalid_request(error).detail == f"limit must be a whole number 1-{MAX_LIST_LIMIT}"


# --- state filters and outcomes ----------------------------------------------------------------


def test_state_filters_are_the_state_names() -> None:
    assert effect_state(None) is None
    for state in EffectState:
        assert effect_state(state.value) is state


@pytest.mark.parametrize("raw", ["committed", "DONE", "", "UNKNOWN "])
def test_other_state_filters_are_refused(raw: str) -> None:
    with pytest.raises(Refusal) as error:
        effect_state(raw)
    assert "state must be one of DISPATCHING" in invalid_request(error).detail


@pytest.mark.parametrize(
    ("raw", "state"),
    [
        ("committed", EffectState.COMMITTED),
        ("not_committed", EffectState.NOT_COMMITTED),
        ("not-committed", EffectState.NOT_COMMITTED),
    ],
)
def test_outcomes_in_either_spelling(raw: str, state: EffectState) -> None:
    assert outcome(raw) is state


@pytest.mark.parametrize("raw", ["maybe", "COMMITTED", "not committed", "", None, 1, True])
def test_other_outcomes_are_refused(raw: object) -> None:
    with pytest.raises(Refusal) as error:
        outcome(raw)
    assert invalid_request(error).detail == "outcome must be committed or not_committed"
