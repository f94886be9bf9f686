"""The client's own rules, without a proxy: reading answers (httpx.MockTransport), the
wait between acquires, and the lease's renewal schedule (times passed in)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
from fenceproxy_client import FenceClient, errors
from fenceproxy_client._common import (
    FIRST_RETRY_S,
    MAX_BACKOFF_S,
    PROBLEM_TYPE_BASE,
    Grant,
    LeaseNeeds,
    LeaseState,
    Step,
    checked,
    parse_retry_after,
    retry_delay,
)

NOW = 1_800_000_000.0
TOKEN = "fpt_" + "a" * 43


def problem(code: str, status: int, **context: Any) -> dict[str, Any]:
    return {
        "type": PROBLEM_TYPE_BASE + code,
        "title": code,
        "status": status,
        "detail": f"{code} detail",
        "code": code,
        **context,
    }


def problem_response(
    code: str, status: int, headers: dict[str, str] | None = None, **context: Any
) -> httpx.Response:
    return httpx.Response(
        status,
        headers={"Content-Type": "application/problem+json", **(headers or {})},
        content=json.dumps(problem(code, status, **context)).encode(),
        request=httpx.Request("PUT", "http://proxy/rules/r1"),
    )


def granted(epoch: int = 1) -> httpx.Response:
    body = {
        "resource": "rule:r1",
        "holder": "w",
        "epoch": epoch,
        "expires_at": NOW + 10,
        "ttl_s": 10.0,
        "token": TOKEN,
    }
    return httpx.Response(201, json=body)


def client_answering(answers: Callable[[httpx.Request], httpx.Response]) -> FenceClient:
    return FenceClient("http://proxy", transport=httpx.MockTransport(answers))


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("7", 7.0),
        (" 0 ", 0.0),
        (format_datetime(datetime.fromtimestamp(NOW + 30, UTC), usegmt=True), 30.0),
        (format_datetime(datetime.fromtimestamp(NOW - 30, UTC), usegmt=True), 0.0),
        ("1.5", None),  # delay-seconds is digits only
        ("-3", None),
        ("soon", None),
        ("", None),
        (None, None),
    ],
)
def test_retry_after_is_delay_seconds_or_an_http_date(
    value: str | None, seconds: float | None
) -> None:
    assert parse_retry_after(value, NOW) == seconds


def test_each_code_raises_its_class_with_the_problems_fields() -> None:
    with pytest.raises(errors.ResourceBlocked) as blocked:
        checked(problem_response("resource_blocked", 423, effect_ids=["e1", "e2"]), True, NOW)
    assert blocked.value.effect_ids == ["e1", "e2"]
    assert (blocked.value.status, blocked.value.code) == (423, "resource_blocked")
    assert blocked.value.detail == "resource_blocked detail"
    with pytest.raises(errors.OutcomeUnknown) as unknown:
        checked(problem_response("outcome_unknown", 504, effect_id="eff_1"), True, NOW)
    assert unknown.value.effect_id == "eff_1"
    with pytest.raises(errors.LeaseHeld) as held:
        checked(problem_response("lease_held", 409, {"Retry-After": "3"}), True, NOW)
    assert held.value.retry_after_s == 3.0


def test_a_code_this_client_does_not_know_is_still_a_fence_error() -> None:
    with pytest.raises(errors.FenceError) as refused:
        checked(problem_response("something_new", 429), True, NOW)
    assert type(refused.value) is errors.FenceError
    assert refused.value.code == "something_new"


def test_an_upstreams_own_problem_json_is_the_upstreams_answer() -> None:
    """Only the proxy's problem `type` makes a refusal: an upstream answering
    problem+json with a `code` of the same name is relayed as UpstreamError."""
    body = {"type": "https://upstream.example/conflict", "code": "stale_epoch", "status": 409}
    response = httpx.Response(
        409,
        headers={"Content-Type": "application/problem+json"},
        content=json.dumps(body).encode(),
        request=httpx.Request("PUT", "http://proxy/rules/r1"),
    )
    with pytest.raises(errors.UpstreamError) as upstream:
        checked(response, True, NOW)
    assert upstream.value.response is response
    assert checked(response, False, NOW) is response


def test_a_problem_content_type_without_json_is_the_upstreams_answer() -> None:
    response = httpx.Response(
        502,
        headers={"Content-Type": "application/problem+json"},
        content=b"<html>bad gateway</html>",
        request=httpx.Request("GET", "http://proxy/rules/r1"),
    )
    with pytest.raises(errors.UpstreamError):
        checked(response, True, NOW)


def test_the_wait_is_retry_after_when_given_else_a_capped_doubling() -> None:
    with_header = errors.LeaseHeld(409, problem("lease_held", 409), retry_after_s=4.0)
    assert retry_delay(with_header, attempt=7) == 4.0
    zero = errors.LeaseHeld(409, problem("lease_held", 409), retry_after_s=0.0)
    assert retry_delay(zero, attempt=0) == FIRST_RETRY_S
    without = errors.ResourceBlocked(423, problem("resource_blocked", 423))
    delays = [retry_delay(without, attempt) for attempt in range(8)]
    assert delays[:3] == [FIRST_RETRY_S, 2 * FIRST_RETRY_S, 4 * FIRST_RETRY_S]
    assert max(delays) == MAX_BACKOFF_S


def test_wait_s_zero_asks_once_and_raises() -> None:
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return problem_response("lease_held", 409, {"Retry-After": "1"})

    with client_answering(answer) as client, pytest.raises(errors.LeaseHeld):
        client.acquire("rule:r1", "w", wait_s=0.0)
    assert asked == ["/_fence/v1/leases"]


def test_only_not_yet_refusals_are_waited_out() -> None:
    """invalid_request is an answer, not a wait; rate_limited (a code of newer proxies,
    named without importing the proxy) is waited out like lease_held."""
    answers = iter([problem_response("rate_limited", 429, {"Retry-After": "0"}), granted()])
    with client_answering(lambda request: next(answers)) as client:
        lease = client.acquire("rule:r1", "w", wait_s=5.0)
        assert lease.epoch == 1
    asked: list[str] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return problem_response("invalid_request", 400)

    with client_answering(refuse) as client, pytest.raises(errors.InvalidRequest):
        client.acquire("rule:r1", "w", wait_s=5.0)
    assert len(asked) == 1


def test_a_write_whose_answer_is_lost_is_not_sent_again() -> None:
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/_fence/v1/leases":
            return granted()
        sent.append(request.headers.get("Idempotency-Key", ""))
        raise httpx.ReadError("connection reset", request=request)

    with client_answering(answer) as client:
        lease = client.acquire("rule:r1", "w", ttl_s=10)
        with pytest.raises(httpx.ReadError):
            lease.request("POST", "/orders/widget", json={}, idempotency_key="k-1")
    assert sent == ["k-1"]


def test_a_request_carries_the_token_and_the_key() -> None:
    seen: list[httpx.Headers] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/_fence/v1/leases":
            return granted()
        seen.append(request.headers)
        return httpx.Response(200, json={})

    with client_answering(answer) as client:
        lease = client.acquire("rule:r1", "w", ttl_s=10)
        lease.request("PUT", "/rules/r1", json={}, headers={"X-Job": "j1"})
        lease.request("POST", "/orders/w", json={}, idempotency_key="k-9")
    assert seen[0]["Fence-Token"] == TOKEN and "Idempotency-Key" not in seen[0]
    assert seen[0]["X-Job"] == "j1"
    assert (seen[1]["Fence-Token"], seen[1]["Idempotency-Key"]) == (TOKEN, "k-9")
    assert TOKEN not in repr(lease)


# -- the renewal schedule ------------------------------------------------------------


def state(
    renew: bool = True, progress_timeout_s: float | None = None, ttl_s: float = 9.0
) -> LeaseState:
    grant = Grant("rule:r1", "w", 1, NOW + ttl_s, ttl_s, local_expiry=ttl_s)
    return LeaseState(grant, ttl_s, renew, progress_timeout_s, now=0.0)


def test_renewal_is_due_at_a_third_of_the_ttl() -> None:
    lease = state()
    assert lease.next_step(0.0) == (Step.WAIT, 3.0)
    assert lease.next_step(3.0) == (Step.RENEW, 0.0)
    lease.renewed(Grant("rule:r1", "w", 1, NOW + 12, 9.0, local_expiry=12.0), now=3.0)
    assert lease.next_step(3.0) == (Step.WAIT, 3.0)
    assert not lease.is_lost(11.9)


def test_without_progress_renewal_stops_and_the_lease_is_lost_at_its_expiry_once() -> None:
    lease = state(progress_timeout_s=4.0)
    lease.progress(2.5)
    assert lease.next_step(3.0) == (Step.RENEW, 0.0)
    lease.renewed(Grant("rule:r1", "w", 1, NOW + 15, 9.0, local_expiry=15.0), now=6.0)
    assert lease.next_step(6.0) == (Step.WAIT, 0.5)  # woken when progress is 4 s old
    assert lease.next_step(6.5) == (Step.WAIT, 15.0 - 6.5)  # stalled: wait for expiry
    assert lease.renewing is False and not lease.is_lost(14.9)
    lease.progress(7.0)  # too late: renewal does not resume
    assert lease.next_step(9.0) == (Step.WAIT, 6.0)
    assert lease.next_step(15.0) == (Step.LOST, 0.0)
    assert lease.is_lost(15.0)
    assert lease.next_step(15.5) == (Step.DONE, 0.0)


def test_a_failed_renewal_is_tried_again_soon_while_the_lease_lasts() -> None:
    lease = state()
    lease.renewal_failed(3.0)
    step, wait_s = lease.next_step(3.0)
    assert step is Step.WAIT and 0 < wait_s < 3.0
    assert lease.next_step(9.0) == (Step.LOST, 0.0)


def test_a_lease_lost_once_tells_once_and_a_released_one_never() -> None:
    lease = state()
    assert lease.lose("refused") is True
    assert lease.lose("refused again") is False
    released = state()
    released.release()
    assert released.lose("refused") is False
    assert released.next_step(100.0) == (Step.DONE, 0.0)
    assert not released.is_lost(100.0)


def test_without_renewal_the_lease_is_lost_at_its_expiry() -> None:
    lease = state(renew=False)
    assert lease.next_step(1.0) == (Step.WAIT, 8.0)
    assert lease.next_step(9.0) == (Step.LOST, 0.0)


# -- lease sizing and LeaseLost -------------------------------------------------------


def test_renewal_before_a_write_when_less_is_left_than_the_route_needs() -> None:
    lease = state(ttl_s=9.0)  # local expiry at 9.0
    assert not lease.should_renew_for(None, 8.0)  # the need is not known yet
    assert not lease.should_renew_for(2.0, 7.0)  # exactly 2 s left: enough
    assert lease.should_renew_for(2.0, 7.1)
    assert not lease.should_renew_for(9.5, 7.1)  # a renewal to 9 s could not give 9.5


def test_the_renewal_before_a_write_leaves_room_for_the_trip_to_the_proxy() -> None:
    """What the route needs must still be left when the write reaches its admission:
    a write takes about as long to get there as the lease's own calls take to be
    answered, which a loaded machine stretches. Judged at the check, the lease would
    be refused as too short on the way whenever it had just over `needed_s` left."""
    lease = state(ttl_s=9.0)
    # A renewal sent at 3.0 and answered at 3.3: 0.3 s there and back.
    lease.renewed(Grant("rule:r1", "w", 1, NOW + 12, 9.0, local_expiry=12.0), now=3.3)
    assert lease.should_renew_for(2.0, 12.0 - 2.0 - 2 * 0.3 + 0.05)
    assert not lease.should_renew_for(2.0, 12.0 - 2.0 - 2 * 0.3 - 0.05)
    # The slowest of the recent calls counts, not the last one alone.
    lease.renewed(Grant("rule:r1", "w", 1, NOW + 13, 9.0, local_expiry=13.0), now=4.0)
    assert lease.should_renew_for(2.0, 13.0 - 2.0 - 2 * 0.3 + 0.05)
    # A renewal could not give what the route needs: none is tried.
    assert not lease.should_renew_for(9.5, 12.9)


def test_what_a_route_needs_is_learnt_from_lease_too_short_and_bounded() -> None:
    needs = LeaseNeeds()
    too_short = errors.LeaseTooShort(409, problem("lease_too_short", 409, needed_s=2))
    assert needs.learn("put", "/rules/r1", too_short) == 2.0
    assert needs.needed("PUT", "/rules/r1") == 2.0
    assert needs.needed("PUT", "/rules/r2") is None
    older_proxy = errors.LeaseTooShort(409, problem("lease_too_short", 409))
    assert needs.learn("PUT", "/rules/r3", older_proxy) is None
    for n in range(LeaseNeeds.MAX_REMEMBERED):
        needs.learn("PUT", f"/rules/x{n}", too_short)
    assert needs.needed("PUT", "/rules/r1") is None  # the oldest was forgotten


def test_lease_too_short_renews_and_sends_once_more_then_renews_before_the_next() -> None:
    calls: list[str] = []
    refusals = [problem_response("lease_too_short", 409, needed_s=20, remaining_s=9.5)]

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path == "/_fence/v1/leases":
            return granted()
        if request.url.path == "/_fence/v1/leases/renew":
            return granted()
        return refusals.pop() if refusals else httpx.Response(200, json={})

    with client_answering(answer) as client:
        lease = client.acquire("rule:r1", "w", ttl_s=30)
        lease.request("PUT", "/rules/r1", json={})
        lease.request("PUT", "/rules/r1", json={})
    assert calls == [
        "/_fence/v1/leases",
        "/rules/r1",  # refused: lease_too_short, nothing sent upstream
        "/_fence/v1/leases/renew",
        "/rules/r1",
        # granted() gives 10 s, less than the 20 s the route needs: renewed first
        "/_fence/v1/leases/renew",
        "/rules/r1",
    ]


def test_check_raises_lease_lost_with_why() -> None:
    lease = state(renew=False)
    lease.check(1.0)
    with pytest.raises(errors.LeaseLost, match="expired without a renewal"):
        lease.check(9.0)
    refused = state()
    refused.lose("renewal refused: stale_epoch")
    with pytest.raises(errors.LeaseLost) as lost:
        refused.check(0.0)
    assert (lost.value.resource, lost.value.epoch, lost.value.why) == (
        "rule:r1",
        1,
        "renewal refused: stale_epoch",
    )


def test_the_client_key_goes_on_lease_calls_and_reads_never_on_a_fenced_request() -> None:
    seen: dict[str, str | None] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        seen[request.url.path] = request.headers.get("Authorization")
        if request.url.path.startswith("/_fence/v1/leases"):
            return granted()
        if request.url.path.startswith("/_fence/v1/effects/"):
            return httpx.Response(200, json={"id": "eff-1", "state": "COMMITTED"})
        return httpx.Response(200, json={})

    transport = httpx.MockTransport(answer)
    with FenceClient("http://proxy", api_key="key-1", transport=transport) as client:
        lease = client.acquire("rule:r1", "w", ttl_s=10)
        lease.request("PUT", "/rules/r1", json={})
        lease.renew()
        assert client.wait_settled("eff-1", 1.0) == "COMMITTED"
        lease.release()
    assert seen == {
        "/_fence/v1/leases": "Bearer key-1",
        "/rules/r1": None,
        "/_fence/v1/leases/renew": "Bearer key-1",
        "/_fence/v1/effects/eff-1": "Bearer key-1",
        "/_fence/v1/leases/release": "Bearer key-1",
    }


@pytest.mark.parametrize(("code", "status"), [("forbidden", 403), ("forbidden_resource", 403)])
def test_a_renewal_refused_for_the_clients_standing_loses_the_lease(code: str, status: int) -> None:
    # The client was removed from auth: or its globs narrowed: renewing will never work
    # again, so the lease is lost now (not retried every half second until it expires).
    def answers(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/renew"):
            return problem_response(code, status)
        return granted()

    lost: list[str] = []
    lease = client_answering(answers).acquire("rule:r1", "w", on_lost=lambda: lost.append("lost"))
    with pytest.raises(errors.FenceError):
        lease.renew()
    with pytest.raises(errors.LeaseLost):
        lease.check()
    assert len(lost) == 1
