"""The Store contract, on SQLite and PostgreSQL alike: isolation under concurrency,
failure isolation, migrations, durability.

Each test runs once per backend (the `backend` fixture of conftest.py). What only one
backend has is tested in test_store_sqlite_only.py (WAL, synchronous, group commit)
and test_store_postgres.py (several replicas on one database, the database's clock).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from core.records import LeaseRecord, Refusal
from store import Store, open_store
from store.base import Tx
from store.queries import load_migrations
from tests.integration.app import backends
from tests.integration.app.backends import Backend
from tests.integration.app.conftest import FakeClock

AcquireResult = tuple[LeaseRecord, float] | Refusal
_serial = itertools.count()


def new_token_hash() -> str:
    return hashlib.sha256(f"token-{next(_serial)}".encode()).hexdigest()


@asynccontextmanager
async def running_store(
    store_url: str, clock: FakeClock, query: str = "", instance_id: str = "instance-1"
) -> AsyncIterator[Store]:
    store = open_store(f"{store_url}{query}", clock, instance_id)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def acquire(
    store: Store, resource: str, holder: str = "w", ttl_s: float = 30
) -> AcquireResult:
    return await store.acquire(resource, holder, ttl_s, new_token_hash())


def granted(result: AcquireResult) -> LeaseRecord:
    assert not isinstance(result, Refusal), result
    return result[0]


async def test_concurrent_acquires_are_isolated(store_url: str, clock: FakeClock) -> None:
    """50 acquires of distinct resources and 50 of one shared resource at once, three
    times: every distinct one is granted, exactly one shared one is, per round."""
    async with running_store(store_url, clock) as store:
        shared_epochs: list[int] = []
        for round_ in range(3):
            distinct = [acquire(store, f"r{round_}-{i}", holder=f"d{i}") for i in range(50)]
            shared = [acquire(store, "shared", holder=f"s{i}") for i in range(50)]
            results = await asyncio.gather(*distinct, *shared)

            distinct_results, shared_results = results[:50], results[50:]
            assert [granted(r).epoch for r in distinct_results] == [1] * 50
            grants = [r for r in shared_results if not isinstance(r, Refusal)]
            refusals = [r for r in shared_results if isinstance(r, Refusal)]
            assert len(grants) == 1
            assert {r.code for r in refusals} == {"lease_held"}
            shared_epochs.append(grants[0][0].epoch)
            view = await store.lease_view("shared")
            assert (view.epoch, view.holder, view.live) == (
                shared_epochs[-1],
                grants[0][0].holder,
                True,
            )
            clock.advance(31)  # let every lease expire before the next round

    assert shared_epochs == sorted(set(shared_epochs))  # strictly increasing
    assert shared_epochs == [1, 2, 3]
    rows = await backends.rows(
        store_url, "SELECT epoch, holder FROM leases WHERE resource = ?", ("shared",)
    )
    assert sorted(epoch for epoch, _ in rows) == [1, 2, 3]
    others = await backends.rows(
        store_url, "SELECT COUNT(*) FROM leases WHERE resource != ?", ("shared",)
    )
    assert others == [(150,)]


class Poison(Exception):
    pass


async def poisoned_among_others(store: Store) -> tuple[list[Any], list[str]]:
    """Ten acquires, a witness write and two operations that write and then fail, all
    at once. Returns every result (or exception) and the witness's runs."""
    runs: list[str] = []

    async def poisoned(tx: Tx) -> None:
        # Writes first, then fails: its write must be rolled back, nobody else's.
        await tx.execute("set_resource_epoch", resource="poisoned", epoch=41)
        raise Poison("this operation always fails")

    async def witness(tx: Tx) -> str:
        # Counts its runs (SQLite's group commit retries it: test_store_sqlite_only.py).
        runs.append("witness")
        await tx.execute("set_resource_epoch", resource="witness", epoch=5)
        return "done"

    calls: list[Awaitable[Any]] = [acquire(store, f"ok-{i}") for i in range(10)]
    calls[5:5] = [store.connector.write(witness), store.connector.write(poisoned)]
    calls.append(store.connector.write(poisoned))
    results = await asyncio.gather(*calls, return_exceptions=True)
    return results, runs


async def test_failing_operations_lose_nothing_of_the_others(
    store_url: str, clock: FakeClock
) -> None:
    async with running_store(store_url, clock) as store:
        results, runs = await poisoned_among_others(store)

        assert runs and set(runs) == {"witness"}
        failures = [r for r in results if isinstance(r, BaseException)]
        assert len(failures) == 2
        assert all(isinstance(f, Poison) for f in failures)
        assert "done" in results
        leases = [granted(r) for r in results if isinstance(r, tuple)]
        assert sorted(lease.resource for lease in leases) == sorted(f"ok-{i}" for i in range(10))
        # The writer is still alive after the failure.
        assert granted(await acquire(store, "after")).epoch == 1

    async with running_store(store_url, clock) as reopened:
        for i in range(10):
            view = await reopened.lease_view(f"ok-{i}")
            assert (view.epoch, view.holder, view.live) == (1, "w", True)
        assert (await reopened.lease_view("poisoned")).epoch == 0
        assert (await reopened.lease_view("witness")).epoch == 5
        assert (await reopened.lease_view("after")).epoch == 1


async def test_failing_operation_alone_is_reported_and_rolled_back(
    store_url: str, clock: FakeClock
) -> None:
    async def poisoned(tx: Tx) -> None:
        await tx.execute("set_resource_epoch", resource="poisoned", epoch=7)
        raise Poison("fails")

    async with running_store(store_url, clock) as store:
        with pytest.raises(Poison):
            await store.connector.write(poisoned)
        assert (await store.lease_view("poisoned")).epoch == 0
        assert granted(await acquire(store, "poisoned")).epoch == 1


MIGRATIONS_SQL = "SELECT version, name, applied_at FROM schema_migrations ORDER BY version"


async def test_migrations_are_recorded_once(
    store_url: str, clock: FakeClock, backend: Backend
) -> None:
    shipped = [(version, name) for version, name, _ in load_migrations(backend)]
    assert shipped[0] == (1, "initial")
    async with running_store(store_url, clock) as store:
        granted(await acquire(store, "r"))
    migrations = await backends.rows(store_url, MIGRATIONS_SQL)
    assert [(version, name) for version, name, _ in migrations] == shipped

    clock.advance(100)
    async with running_store(store_url, clock) as store:
        # Re-applying the initial migration would fail (CREATE TABLE) or wipe the data.
        assert (await store.lease_view("r")).epoch == 1
    assert await backends.rows(store_url, MIGRATIONS_SQL) == migrations


async def test_acquire_is_durable_once_acknowledged(store_url: str, clock: FakeClock) -> None:
    async with running_store(store_url, clock) as store:
        lease = granted(await acquire(store, "durable", holder="h", ttl_s=10))
        # A second connection sees the committed grant while the store is still open.
        assert await backends.rows(
            store_url,
            "SELECT epoch, holder, expires_at FROM leases WHERE resource = ?",
            ("durable",),
        ) == [(1, "h", lease.expires_at)]


async def test_a_read_sees_one_moment(store_url: str, clock: FakeClock) -> None:
    """A read operation's statements see the store as of one moment, even when another
    replica commits between them: an effect and its history are read together
    (effect_with_events), and a row read before a probe's receipt must not meet the
    probe's event read after it."""
    async with running_store(store_url, clock) as store:
        granted(await acquire(store, "r"))

        async def epoch(tx: Tx) -> int:
            row = await tx.one("resource_state", resource="r")
            assert row is not None
            return int(row["epoch"])

        async def twice(tx: Tx) -> tuple[int, int]:
            first = await epoch(tx)
            # Synchronous, on a connection of its own: committed before the next
            # statement, and no suspension (SQLite's operations may not suspend).
            backends.commit_now(store_url, "UPDATE resources SET epoch = 7 WHERE resource = 'r'")
            return first, await epoch(tx)

        assert await store.connector.read(twice) == (1, 1)
        assert await store.connector.read(epoch) == 7
