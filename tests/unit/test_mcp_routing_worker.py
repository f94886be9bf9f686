"""What the MCP routing example's worker makes of each refusal of the proxy: which jobs
are tried again, which are held because an effect is in doubt, which have failed; and of
a write whose answer was lost: never "nothing was done" unless no connection was made."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from fenceproxy_client import Lease, errors

from examples.mcp_routing.jobs import (
    ANSWER_LOST,
    BLOCKED,
    DONE,
    FAILED,
    PENDING,
    Claim,
    JobStore,
    Outcome,
    blocked_next_step,
)
from examples.mcp_routing.worker import (
    ProxyAccess,
    WorkerSettings,
    outcome_of_refusal,
    outcome_of_settlement,
    write_rule,
)


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


# --- a write whose answer is lost ------------------------------------------------------

JOB = Claim("job-1", "r1", "eu-west", 1, "worker-1")
BODY = {"route_to": "eu-west"}
REQUEST = httpx.Request("PUT", "http://proxy/rules/r1")


def settings(settle_wait_s: float = 5.0) -> WorkerSettings:
    return WorkerSettings(
        proxy=ProxyAccess("http://proxy"),
        state_dir=Path("unused"),
        name="worker-1",
        lease_ttl_s=10.0,
        lease_wait_s=1.0,
        claim_ttl_s=20.0,
        http_timeout_s=1.0,
        settle_wait_s=settle_wait_s,
        blocked_recheck_s=10.0,
    )


def answered(version: int, replayed: bool = False) -> httpx.Response:
    headers = {"Fence-Epoch": "3", **({"Idempotent-Replayed": "true"} if replayed else {})}
    return httpx.Response(200, json={"version": version}, headers=headers, request=REQUEST)


class ScriptedLease:
    """Answers each PUT with the next of `answers` (raised if an exception); records
    what was sent."""

    epoch = 3

    def __init__(self, *answers: httpx.Response | Exception, settled: str = "COMMITTED") -> None:
        self.answers = list(answers)
        self.sent: list[tuple[str, str | None, Any]] = []
        self.settled = settled
        self.waited_for: list[str] = []
        self.unreadable: list[Exception] = []  # raised by the next reads of the settlement

    def request(
        self, method: str, path: str, *, json: Any = None, idempotency_key: str | None = None
    ) -> httpx.Response:
        self.sent.append((method, idempotency_key, json))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def wait_settled(self, effect_id: str, timeout_s: float) -> str:
        self.waited_for.append(effect_id)
        if self.unreadable:
            raise self.unreadable.pop(0)
        return self.settled


class AliveStore:
    def progress(self, claim: Claim, claim_ttl_s: float, *, phase: str) -> bool:
        return True


def write(lease: ScriptedLease, settle_wait_s: float = 5.0) -> Outcome:
    return write_rule(
        cast(Lease, lease),
        cast(JobStore, AliveStore()),
        JOB,
        settings(settle_wait_s),
        "/rules/r1",
        BODY,
    )


def test_the_write_carries_the_jobs_id_as_its_idempotency_key() -> None:
    lease = ScriptedLease(answered(7))

    assert write(lease) == Outcome("written", DONE, "version 7 under epoch 3")
    assert lease.sent == [("PUT", "job-1", BODY)]


@pytest.mark.parametrize(
    "error", [httpx.ConnectError("refused"), httpx.ConnectTimeout("connect timed out")]
)
def test_only_a_connection_never_made_is_nothing_done(error: Exception) -> None:
    lease = ScriptedLease(error)

    outcome = write(lease)

    assert (outcome.outcome, outcome.job_state) == ("proxy_unreachable", PENDING)
    assert len(lease.sent) == 1


@pytest.mark.parametrize(
    "error",
    [
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ReadError("reset"),
        httpx.ReadTimeout("timed out"),
    ],
)
def test_a_lost_answer_is_asked_again_with_the_same_key_and_body(error: Exception) -> None:
    lease = ScriptedLease(error, answered(7, replayed=True))

    outcome = write(lease)

    assert (outcome.outcome, outcome.job_state) == ("written", DONE)
    assert outcome.detail is not None and "replayed by the proxy" in outcome.detail
    assert lease.sent == [("PUT", "job-1", BODY)] * 2


def test_a_lost_answer_the_proxy_cannot_be_asked_about_blocks_the_job() -> None:
    lease = ScriptedLease(httpx.ReadError("reset"), refusal("stale_epoch"))

    outcome = write(lease)

    assert (outcome.outcome, outcome.job_state, outcome.effect_id) == (
        ANSWER_LOST,
        BLOCKED,
        None,
    )
    assert outcome.detail == (
        "the answer to the write was lost (ReadError); asking again was refused: stale_epoch"
    )


def test_a_lost_answer_still_unanswered_at_the_settle_wait_blocks_the_job() -> None:
    lease = ScriptedLease(httpx.ReadError("reset"), httpx.ConnectError("refused"))

    outcome = write(lease, settle_wait_s=0.0)

    assert (outcome.outcome, outcome.job_state) == (ANSWER_LOST, BLOCKED)
    assert outcome.detail == (
        "the answer to the write was lost (ReadError); no answer to asking again either"
    )
    assert len(lease.sent) == 2  # asked again at once, however short the wait


@pytest.mark.parametrize(
    ("code", "status"), [("idempotency_key_reused", 422), ("request_in_progress", 409)]
)
def test_a_key_naming_an_earlier_write_of_the_job_makes_it_follow_that_write(
    code: str, status: int
) -> None:
    lease = ScriptedLease(refusal(code, status, effect_id="eff-first"))

    outcome = write(lease)

    assert outcome == Outcome("written", DONE, "effect eff-first settled COMMITTED")
    assert lease.waited_for == ["eff-first"]


def test_a_blocked_job_whose_answer_was_lost_never_says_nothing_was_sent() -> None:
    result = {"outcome": ANSWER_LOST, "detail": "the answer to the write was lost (ReadError)"}

    said = blocked_next_step(None, None, result)

    assert "Nothing of this job was sent" not in said
    assert said.startswith("The answer to this job's write was lost on its way back")
    assert "Idempotency-Key" in said


def test_a_settlement_that_cannot_be_read_for_a_while_is_read_again_not_nothing_done() -> None:
    lease = ScriptedLease(refusal("outcome_unknown", 504, effect_id="eff-1"))
    lease.unreadable = [httpx.ReadError("reset"), httpx.ConnectError("refused")]

    outcome = write(lease)

    assert outcome == Outcome("written", DONE, "effect eff-1 settled COMMITTED")
    assert lease.waited_for == ["eff-1"] * 3
