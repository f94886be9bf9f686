"""The recovery window's answer to a key the store lost (PostgreSQL: only its store
can lose history in a failover; the failover itself is tests/integration/replicas/
test_failover.py's, with real processes).

The store lost the key's record, fingerprint included; the route's probe can say only
that *a* request with this key was applied upstream. The proxy cannot tell whether it
was this request, so it never answers "the operation was applied": a worker that had
been refused `idempotency_key_reused` for another payload before the failover would
take its own operation as done while the upstream holds only the first one.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.app import backends
from tests.integration.app.backends import Backend
from tests.integration.app.conftest import PROBE_BY_KEY, Fence, FenceFactory, assert_problem

KEY = "k-lost-in-failover"
APPLIED = {"qty": 1}
OTHER = {"qty": 5}


@pytest.fixture
def backend() -> Backend:
    return "postgresql"


async def open_recovery_window(fence: Fence) -> None:
    """As the failover's recovery does (store/history.py): opened well over the probe's
    settle window ago, so the probe's answer is believed at once."""
    await backends.rows(
        fence.store_url,
        "UPDATE store_meta SET recovery_opened_at = ?, recovery_reason = ?",
        (fence.clock.now - 60, "a test: the store lost history"),
    )
    assert await fence.store.refresh_recovery() is not None


async def applied_before_the_failover(fence: Fence) -> None:
    """The old primary forwarded APPLIED under KEY; the new store has no record of it."""
    response = await fence.upstream.post(
        "/orders/widget", data=json.dumps(APPLIED), headers={"Idempotency-Key": KEY}
    )
    assert response.status == 201, await response.text()


@pytest.mark.parametrize("payload", [OTHER, APPLIED], ids=["another-payload", "same-payload"])
async def test_a_key_the_probe_says_was_applied_is_never_called_this_request_applied(
    make_fence: FenceFactory, payload: dict[str, int]
) -> None:
    fence = await make_fence(reconcile=PROBE_BY_KEY)
    await applied_before_the_failover(fence)
    await open_recovery_window(fence)
    lease = await fence.acquire("supplier:widget")

    response = await fence.order("widget", lease["token"], KEY, body=payload)

    # One answer for both payloads: with the fingerprint lost, they cannot be told apart.
    problem = await assert_problem(response, 409, "key_applied_request_unknown")
    assert "replayed" not in problem and "idempotent-replayed" not in response.headers
    detail = problem["detail"]
    assert "a request with idempotency key" in detail and "was applied" in detail, detail
    assert "cannot tell whether it was this request" in detail, detail
    assert "nothing was forwarded" in detail, detail
    assert problem["resource"] == "supplier:widget"
    # The upstream holds the first payload only; nothing was recorded as this request.
    orders = (await (await fence.upstream.get("/orders/widget")).json())["orders"]
    assert [order["qty"] for order in orders] == [APPLIED["qty"]], orders
    assert await backends.count(fence.store_url, "effects") == 0
