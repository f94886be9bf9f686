"""Headers with meaning cannot be removed by a Connection header.

A `Connection` header that names a header makes it hop-by-hop: the proxy strips it
before forwarding. Named `Idempotency-Key`, that let the proxy use the key for its own
check and then send the request upstream without it: the probe by key found nothing,
the effect settled NOT_COMMITTED, the key was freed and the retry ordered again.
"""

from __future__ import annotations

import pytest

from tests.integration.app.conftest import (
    PROBE_BY_KEY,
    FenceFactory,
    assert_problem,
)

RESOURCE = "supplier:widget"


@pytest.mark.parametrize(
    "named",
    [
        "Idempotency-Key",
        "idempotency-key",
        "keep-alive, Idempotency-Key",
        "Fence-Token",
        "Fence-Epoch",
        "Content-Length",
        "Transfer-Encoding",
    ],
)
async def test_a_connection_header_naming_a_meaningful_header_is_refused_before_anything(
    make_fence: FenceFactory, named: str
) -> None:
    fence = await make_fence(reconcile=PROBE_BY_KEY)
    lease = await fence.acquire(RESOURCE, "worker-a", ttl_s=30)
    refused = await fence.order(
        "widget", lease["token"], "k1", headers={"Connection": named, "Demo-Drop-Response": "1"}
    )
    body = await assert_problem(refused, 400, "invalid_request")
    assert "Connection" in body["detail"]
    assert await fence.effects() == []
    assert await fence.upstream_orders() == 0
    # The worker's plain retry goes through once, with its key forwarded.
    sent = await fence.order("widget", lease["token"], "k1")
    assert sent.status == 201
    assert (await fence.headers_seen())["last_headers"]["idempotency-key"] == "k1"
    assert await fence.upstream_orders() == 1


async def test_a_connection_header_naming_an_ordinary_header_still_strips_it(
    make_fence: FenceFactory,
) -> None:
    fence = await make_fence()
    lease = await fence.acquire(RESOURCE, "worker-a", ttl_s=30)
    sent = await fence.order(
        "widget", lease["token"], "k1", headers={"Connection": "X-Trace", "X-Trace": "abc"}
    )
    assert sent.status == 201
    assert "x-trace" not in (await fence.headers_seen())["last_headers"]
