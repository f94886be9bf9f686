"""The SQLite Store on its own: group commit, failure isolation, migrations, durability."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from proxy.records import LeaseRecord, Refusal
from proxy.store import Store, open_store
from proxy.store.base import Tx
from proxy.store.queries import load_migrations
from proxy.store.sqlite import SQLiteConnector
from tests.integration.app.conftest import FakeClock, sqlite_rows

AcquireResult = tuple[LeaseRecord, float] | Refusal
_serial = itertools.count()


def new_token_hash() -> str:
    return hashlib.sha256(f"token-{next(_serial)}".encode()).hexdigest()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@asynccontextmanager
async def running_store(db_path: Path, clock: FakeClock, query: str = "") -> AsyncIterator[Store]:
    store = open_store(f"sqlite:///{db_path}{query}", clock, "instance-1")
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


async def test_concurrent_acquires_are_isolated_within_group_commits(
    db_path: Path, clock: FakeClock
) -> None:
    async with running_store(db_path, clock) as store:
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
    rows = sqlite_rows(db_path, "SELECT epoch, holder FROM leases WHERE resource = 'shared'")
    assert sorted(epoch for epoch, _ in rows) == [1, 2, 3]
    assert sqlite_rows(db_path, "SELECT COUNT(*) FROM leases WHERE resource != 'shared'") == [
        (150,)
    ]


class Poison(Exception):
    pass


async def test_one_failing_operation_does_not_lose_the_rest_of_its_batch(
    db_path: Path, clock: FakeClock
) -> None:
    runs: list[str] = []

    async def poisoned(tx: Tx) -> None:
        # Writes first, then fails: its write must be rolled back, nobody else's.
        await tx.execute("set_resource_epoch", resource="poisoned", epoch=41)
        raise Poison("this operation always fails")

    async def witness(tx: Tx) -> str:
        # Counts its runs: a second run shows it shared the poisoned batch's
        # transaction, was rolled back with it, and was then retried on its own.
        runs.append("witness")
        await tx.execute("set_resource_epoch", resource="witness", epoch=5)
        return "done"

    async with running_store(db_path, clock) as store:
        calls: list[Awaitable[Any]] = [acquire(store, f"ok-{i}") for i in range(10)]
        calls[5:5] = [store.connector.write(witness), store.connector.write(poisoned)]
        calls.append(store.connector.write(poisoned))
        results = await asyncio.gather(*calls, return_exceptions=True)

        assert runs == ["witness", "witness"]  # it really was in a batch that failed
        failures = [r for r in results if isinstance(r, BaseException)]
        assert len(failures) == 2
        assert all(isinstance(f, Poison) for f in failures)
        assert "done" in results
        leases = [granted(r) for r in results if isinstance(r, tuple)]
        assert sorted(lease.resource for lease in leases) == sorted(f"ok-{i}" for i in range(10))
        # The writer is still alive after the failure.
        assert granted(await acquire(store, "after")).epoch == 1

    async with running_store(db_path, clock) as reopened:
        for i in range(10):
            view = await reopened.lease_view(f"ok-{i}")
            assert (view.epoch, view.holder, view.live) == (1, "w", True)
        assert (await reopened.lease_view("poisoned")).epoch == 0
        assert (await reopened.lease_view("witness")).epoch == 5
        assert (await reopened.lease_view("after")).epoch == 1


async def test_failing_operation_alone_is_reported_and_rolled_back(
    db_path: Path, clock: FakeClock
) -> None:
    async def poisoned(tx: Tx) -> None:
        await tx.execute("set_resource_epoch", resource="poisoned", epoch=7)
        raise Poison("fails")

    async with running_store(db_path, clock) as store:
        with pytest.raises(Poison):
            await store.connector.write(poisoned)
        assert (await store.lease_view("poisoned")).epoch == 0
        assert granted(await acquire(store, "poisoned")).epoch == 1


async def test_migrations_are_recorded_once(db_path: Path, clock: FakeClock) -> None:
    shipped = [(version, name) for version, name, _ in load_migrations("sqlite")]
    assert shipped[0] == (1, "initial")
    first_open = clock.now
    async with running_store(db_path, clock) as store:
        granted(await acquire(store, "r"))
    migrations = sqlite_rows(
        db_path, "SELECT version, name, applied_at FROM schema_migrations ORDER BY version"
    )
    assert migrations == [(version, name, first_open) for version, name in shipped]

    clock.advance(100)
    async with running_store(db_path, clock) as store:
        # Re-applying the initial migration would fail (CREATE TABLE) or wipe the data.
        assert (await store.lease_view("r")).epoch == 1
    again = sqlite_rows(
        db_path, "SELECT version, name, applied_at FROM schema_migrations ORDER BY version"
    )
    assert again == migrations


async def pragma(store: Store, name: str) -> Any:
    connector = store.connector
    assert isinstance(connector, SQLiteConnector)
    writer = connector._writer
    assert writer is not None
    rows = list(await writer.execute_fetchall(f"PRAGMA {name}"))
    return rows[0][0]


async def test_wal_and_full_synchronous_by_default(db_path: Path, clock: FakeClock) -> None:
    async with running_store(db_path, clock) as store:
        assert str(await pragma(store, "journal_mode")).lower() == "wal"
        assert await pragma(store, "synchronous") == 2  # FULL
    assert sqlite_rows(db_path, "PRAGMA journal_mode") == [("wal",)]  # persisted in the file


@pytest.mark.parametrize(
    ("query", "expected"), [("?synchronous=NORMAL", 1), ("?synchronous=extra", 3)]
)
async def test_synchronous_from_the_url_is_honoured(
    db_path: Path, clock: FakeClock, query: str, expected: int
) -> None:
    async with running_store(db_path, clock, query) as store:
        assert await pragma(store, "synchronous") == expected
        assert str(await pragma(store, "journal_mode")).lower() == "wal"
    assert (db_path.parent / "store.db").exists()
    assert not (db_path.parent / f"store.db{query}").exists()


async def test_acquire_is_durable_once_acknowledged(db_path: Path, clock: FakeClock) -> None:
    async with running_store(db_path, clock) as store:
        lease = granted(await acquire(store, "durable", holder="h", ttl_s=10))
        # A second connection sees the committed grant while the store is still open.
        assert sqlite_rows(
            db_path, "SELECT epoch, holder, expires_at FROM leases WHERE resource = 'durable'"
        ) == [(1, "h", lease.expires_at)]
