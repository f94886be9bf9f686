"""The send deadline on the whole fenced path: a write admitted, then found past its
send window once the connection is had, is not sent; the effect settles NOT_SENT,
its key is free, the worker is told nothing was sent, and the metric counts it. The
send deadline's clock is replaced by one that jumps (no waiting); the processes'
version of this is tests/integration/replicas/test_send_deadline.py."""

from __future__ import annotations

import itertools

import pytest

from proxy import forwarding
from proxy.runtime import RUNTIME
from tests.integration.app.conftest import Fence, assert_problem

RESOURCE = "supplier:widget"
METRIC = "fenceproxy_send_deadline_passed_total"


async def test_a_write_past_its_send_deadline_is_not_sent(
    fence: Fence, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = await fence.acquire(RESOURCE)
    # Each reading of the clock is an hour after the last: the budget, started before
    # the admission, has run out by the check at the send.
    hours = itertools.count(0.0, 3600.0)
    monkeypatch.setattr(forwarding, "SEND_CLOCK", lambda: next(hours))

    response = await fence.order("widget", lease["token"], "k-1")

    problem = await assert_problem(response, 502, "upstream_unreachable")
    assert "send deadline (0.5s after admission) passed" in problem["detail"], problem
    assert "nothing was sent" in problem["detail"], problem
    effect = await fence.effect(problem["effect_id"])
    assert effect["state"] == "NOT_SENT", effect
    assert (await fence.headers_seen())["last_headers"] == {}  # nothing arrived at all
    assert await fence.upstream_orders() == 0
    metrics = fence.app[RUNTIME].metrics.registry
    assert metrics.get_sample_value(METRIC, {"route": "place-order"}) == 1

    # The key is free and the clock is the real one again: the retry is sent.
    monkeypatch.undo()
    retry = await fence.order("widget", lease["token"], "k-1")
    assert retry.status == 201, await retry.text()
    assert await fence.upstream_orders() == 1
    assert metrics.get_sample_value(METRIC, {"route": "place-order"}) == 1
