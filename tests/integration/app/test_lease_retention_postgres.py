"""Retention of leases and resources racing a lease's holder, on PostgreSQL only: the
one backend where a transaction can read a lease, then wait for its resource's lock
while retention deletes both.

The collector's side is played by a connection of the test's own, so that the
interleaving is exact: it holds the resource's row lock, the store's call reads the
lease and waits for that lock, then the connection deletes the lease and the row
(and raises the floor), as a pass does, and commits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import asyncpg
import pytest

from core.records import Refusal
from store import Store
from tests.integration.app.backends import Backend
from tests.integration.app.conftest import FakeClock
from tests.integration.app.test_retention import order
from tests.integration.app.test_store_contract import granted, new_token_hash, running_store

WAIT_S = 10.0


@pytest.fixture
def backend() -> Backend:
    return "postgresql"


@pytest.fixture
async def store(store_url: str, clock: FakeClock) -> AsyncIterator[Store]:
    async with running_store(store_url, clock) as opened:
        yield opened


async def waiting_for_a_lock(conn: asyncpg.Connection, others: int) -> None:
    """Poll (bounded) until `others` backends of this database wait for a lock."""
    for _ in range(int(WAIT_S / 0.02)):
        waiting = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND pid <> pg_backend_pid()"
        )
        if waiting >= others:
            return
        await asyncio.sleep(0.02)
    pytest.fail("the store's call never waited for the resource's lock")


async def collected_while_waiting(
    store_url: str, resource: str, call: Callable[[], Coroutine[Any, Any, object]]
) -> object:
    """Run `call` while the resource's lease and row are deleted under its nose."""
    conn = await asyncpg.connect(store_url)
    try:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM resources WHERE resource = $1 FOR UPDATE", resource)
            task = asyncio.create_task(call())
            await waiting_for_a_lock(conn, 1)
            await conn.execute("DELETE FROM leases WHERE resource = $1", resource)
            epoch = await conn.fetchval(
                "DELETE FROM resources WHERE resource = $1 RETURNING epoch", resource
            )
            await conn.execute(
                "UPDATE store_meta SET epoch_floor = $1 WHERE epoch_floor < $1", epoch
            )
        return await asyncio.wait_for(task, WAIT_S)
    finally:
        await conn.close()


@pytest.mark.parametrize("operation", ["release", "renew", "admit"])
async def test_a_lease_collected_while_its_holder_waited_for_the_lock_is_no_lease(
    operation: str, store: Store, store_url: str
) -> None:
    token = new_token_hash()
    lease = granted(await store.acquire("r:a", "worker-a", 30, token))
    calls = {
        "release": lambda: store.release(token),
        "renew": lambda: store.renew(token, 30),
        "admit": lambda: store.admit(token, order("r:a", "k-1")),
    }

    refused = await collected_while_waiting(store_url, "r:a", calls[operation])

    # Not "superseded at epoch 0": the token names no lease any more, as for any call
    # made after the collection.
    assert isinstance(refused, Refusal), refused
    assert refused.code == "invalid_token", refused
    again = granted(await store.acquire("r:a", "worker-b", 30, new_token_hash()))
    assert again.epoch > lease.epoch


async def test_an_acquire_that_waited_for_the_lock_while_the_name_was_collected_starts_above_it(
    store: Store, store_url: str
) -> None:
    """One order of test_lease_retention.py's acquires racing the collector, made exact:
    the collector took the name's lock first, and another replica's acquire waited for
    it while the lease and the row went and the floor rose. The acquire finds no row
    once it holds the lock, and starts above the floor the deletion raised."""
    token = new_token_hash()
    lease = granted(await store.acquire("r:a", "worker-a", 30, token))
    assert not isinstance(await store.release(token), Refusal)

    async def acquired_epoch() -> int:
        return granted(await store.acquire("r:a", "worker-b", 30, new_token_hash())).epoch

    epoch = await collected_while_waiting(store_url, "r:a", acquired_epoch)

    assert isinstance(epoch, int) and epoch > lease.epoch, epoch
