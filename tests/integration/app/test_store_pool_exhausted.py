"""A PostgreSQL pool with no free connection: an acquire waits at most
`store_pool.acquire_timeout_s`, then is 503 store_unavailable with Retry-After, and
/_fence/readyz says not ready, instead of both hanging (or readyz answering 200)."""

from __future__ import annotations

import asyncio

import pytest

from store.base import Tx
from tests.integration.app.backends import Backend
from tests.integration.app.conftest import FenceFactory, json_body


@pytest.fixture
def backend() -> Backend:
    return "postgresql"


async def test_a_full_pool_is_503_and_not_ready(make_fence: FenceFactory) -> None:
    fence = await make_fence(top_level="store_pool: {max_size: 1, acquire_timeout_s: 0.3}\n")
    release, holding = asyncio.Event(), asyncio.Event()

    async def hold(tx: Tx) -> None:
        holding.set()
        await release.wait()

    busy = asyncio.create_task(fence.store.connector.write(hold))
    try:
        # In its transaction: a write queued meanwhile (behind a background write) would
        # share it.
        await holding.wait()
        refused = await fence.acquire_response("supplier:full-pool")
        body = await json_body(refused)
        assert refused.status == 503, body
        assert body["code"] == "store_unavailable"
        assert refused.headers["Retry-After"] == "1"
        ready = await fence.client.get("/_fence/readyz")
        assert ready.status == 503, await ready.text()
    finally:
        release.set()
        await busy
    await fence.acquire("supplier:full-pool")
