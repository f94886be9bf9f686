"""What the MCP routing example's worker makes of each refusal of the proxy: which jobs
are tried again, which are held because an effect is in doubt, which have failed."""

from __future__ import annotations

import pytest
from fenceproxy_client import errors

from examples.mcp_routing.jobs import BLOCKED, DONE, FAILED, PENDING, Outcome
from examples.mcp_routing.worker import outcome_of_refusal, outcome_of_settlement


def refusal(code: str, status: int = 409, **fields: object) -> errors.FenceError:
    return errors.BY_CODE[code](status, {"code": code, "detail": f"{code} detail", **fields})


@pytest.mark.parametrize(
    "code",
    [
        "stale_epoch",
        "lease_expired",
        "lease_held",
        "upstream_unreachable",
        "overloaded",
    ],
)
def test_a_lost_lease_or_a_request_never_sent_is_tried_again(code: str) -> None:
    outcome = outcome_of_refusal(refusal(code))

    assert (outcome.outcome, outcome.job_state, outcome.detail) == (
        code,
        PENDING,
        f"{code} detail",
    )


def test_an_outcome_in_doubt_blocks_the_job_and_names_the_effect() -> None:
    outcome = outcome_of_refusal(refusal("outcome_unknown", 504, effect_id="eff-1"))

    assert (outcome.outcome, outcome.job_state) == ("outcome_unknown", BLOCKED)
    assert (outcome.detail, outcome.effect_id) == ("effect eff-1 in doubt", "eff-1")


def test_a_blocked_resource_blocks_the_job_and_names_the_effects() -> None:
    outcome = outcome_of_refusal(refusal("resource_blocked", effect_ids=["eff-1", "eff-2"]))

    assert (outcome.outcome, outcome.job_state) == ("resource_blocked", BLOCKED)
    assert outcome.detail == "effects in doubt: ['eff-1', 'eff-2']"


@pytest.mark.parametrize(
    "code",
    [
        "invalid_token",
        "wrong_resource",
        "no_route",
        "payload_too_large",
        "lease_too_short",
        "store_unavailable",
    ],
)
def test_any_other_refusal_fails_the_job(code: str) -> None:
    outcome = outcome_of_refusal(refusal(code, 400))

    assert (outcome.outcome, outcome.job_state) == (code, FAILED)


def test_a_write_settled_committed_is_the_job_done() -> None:
    outcome = outcome_of_settlement("eff-1", "COMMITTED")

    assert outcome == Outcome("written", DONE, "effect eff-1 settled COMMITTED")


@pytest.mark.parametrize("state", ["NOT_COMMITTED", "NOT_SENT"])
def test_a_write_settled_as_not_done_makes_the_job_run_again(state: str) -> None:
    outcome = outcome_of_settlement("eff-1", state)

    assert outcome == Outcome(state.lower(), PENDING, f"effect eff-1 settled {state}")
