"""Round trips to PostgreSQL per fenced request: counted by the connector
(store/postgres.py RoundTrips), through the app, admission and receipt together.

The app's background loops (the reconciler polls every 0.2 s) use the same connector,
so a request's count can only be inflated by them, never lowered: each figure is the
least of a few requests, each counted from its start to its answer.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import ClientResponse

from store.postgres import PostgresConnector
from tests.integration.app.backends import Backend
from tests.integration.app.conftest import Fence

RESOURCE = "supplier:widget"
# The bound, for admission and receipt together.
MAX_ROUND_TRIPS = 5
ATTEMPTS = 5


@pytest.fixture
def backend() -> Backend:
    return "postgresql"


async def fewest_round_trips(
    fence: Fence, request: Callable[[int], Awaitable[ClientResponse]], status: int
) -> int:
    connector = fence.store.connector
    assert isinstance(connector, PostgresConnector)
    counts = []
    for attempt in range(ATTEMPTS):
        before = connector.round_trips.count
        response = await request(attempt)
        counts.append(connector.round_trips.count - before)
        assert response.status == status, await response.text()
    return min(counts)


async def test_a_fenced_write_takes_at_most_five_round_trips(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE)

    async def write(attempt: int) -> ClientResponse:
        return await fence.order("widget", lease["token"], f"k-{attempt}", {"qty": attempt})

    trips = await fewest_round_trips(fence, write, 201)

    assert trips <= MAX_ROUND_TRIPS
    # BEGIN, the read under the lock, the write, COMMIT; the receipt in one statement.
    assert trips == 5
    assert await fence.upstream_orders() == ATTEMPTS


async def test_a_write_without_a_key_takes_at_most_five_round_trips(fence: Fence) -> None:
    lease = await fence.acquire("rules:r1")

    async def write(attempt: int) -> ClientResponse:
        return await fence.client.put(
            "/rules/r1", json={"limit": attempt}, headers={"Fence-Token": lease["token"]}
        )

    trips = await fewest_round_trips(fence, write, 200)

    assert trips <= MAX_ROUND_TRIPS


async def test_a_replay_takes_at_most_five_round_trips(fence: Fence) -> None:
    lease = await fence.acquire(RESOURCE)
    first = await fence.order("widget", lease["token"], "k-replayed", {"qty": 2})
    assert first.status == 201

    async def replay(attempt: int) -> ClientResponse:
        return await fence.order("widget", lease["token"], "k-replayed", {"qty": 2})

    trips = await fewest_round_trips(fence, replay, 201)

    assert trips <= MAX_ROUND_TRIPS
    assert trips == 3  # BEGIN, the read, COMMIT: nothing to write
    assert await fence.upstream_orders() == 1


async def test_a_stale_token_refusal_takes_at_most_five_round_trips(fence: Fence) -> None:
    stale = await fence.acquire(RESOURCE)
    await fence.revoke(RESOURCE)

    async def refused(attempt: int) -> ClientResponse:
        return await fence.order("widget", stale["token"], f"k-{attempt}", {"qty": 1})

    trips = await fewest_round_trips(fence, refused, 409)

    assert trips <= MAX_ROUND_TRIPS
    assert await fence.upstream_orders() == 0


async def test_the_metrics_export_the_connectors_count(fence: Fence) -> None:
    connector = fence.store.connector
    assert isinstance(connector, PostgresConnector)
    lease = await fence.acquire(RESOURCE)
    assert (await fence.order("widget", lease["token"], "k-1")).status == 201

    response = await fence.client.get("/_fence/metrics")
    exported = re.search(
        r"^fenceproxy_store_round_trips_total (\S+)$", await response.text(), re.MULTILINE
    )

    assert exported is not None
    # Up to date as of the scrape; the background loops may have sent more since.
    assert 5 <= float(exported.group(1)) <= connector.round_trips.count
