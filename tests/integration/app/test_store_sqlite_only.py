"""What only the SQLite store has: group commit, WAL, synchronous, the injected clock.

The contract both backends share is in test_store_contract.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from store import Store
from store.queries import load_migrations
from store.sqlite import SQLiteConnector
from tests.integration.app.backends import Backend
from tests.integration.app.conftest import FakeClock, sqlite_rows
from tests.integration.app.test_store_contract import (
    acquire,
    granted,
    poisoned_among_others,
    running_store,
)


@pytest.fixture
def backend() -> Backend:
    return "sqlite"


@pytest.fixture
def db_path(tmp_path: Path, store_url: str) -> Path:
    path = tmp_path / "fence.db"
    assert store_url == f"sqlite:///{path}"
    return path


async def test_a_failed_batch_is_retried_one_operation_at_a_time(
    store_url: str, clock: FakeClock
) -> None:
    async with running_store(store_url, clock) as store:
        results, runs = await poisoned_among_others(store)
    # The witness ran twice: it shared the poisoned batch's transaction, was rolled
    # back with it, and was then retried on its own (and kept: "done").
    assert runs == ["witness", "witness"]
    assert "done" in results


async def test_migrations_are_stamped_with_the_injected_clock(
    store_url: str, db_path: Path, clock: FakeClock
) -> None:
    shipped = [(version, name) for version, name, _ in load_migrations("sqlite")]
    first_open = clock.now
    async with running_store(store_url, clock) as store:
        granted(await acquire(store, "r"))
    migrations = sqlite_rows(
        db_path, "SELECT version, name, applied_at FROM schema_migrations ORDER BY version"
    )
    assert migrations == [(version, name, first_open) for version, name in shipped]


async def pragma(store: Store, name: str) -> Any:
    connector = store.connector
    assert isinstance(connector, SQLiteConnector)
    return await connector.pragma(name)


async def test_wal_and_full_synchronous_by_default(
    store_url: str, db_path: Path, clock: FakeClock
) -> None:
    async with running_store(store_url, clock) as store:
        assert str(await pragma(store, "journal_mode")).lower() == "wal"
        assert await pragma(store, "synchronous") == 2  # FULL
    assert sqlite_rows(db_path, "PRAGMA journal_mode") == [("wal",)]  # persisted in the file


@pytest.mark.parametrize(
    ("query", "expected"), [("?synchronous=NORMAL", 1), ("?synchronous=extra", 3)]
)
async def test_synchronous_from_the_url_is_honoured(
    store_url: str, db_path: Path, clock: FakeClock, query: str, expected: int
) -> None:
    async with running_store(store_url, clock, query) as store:
        assert await pragma(store, "synchronous") == expected
        assert str(await pragma(store, "journal_mode")).lower() == "wal"
    # The query is an option, not part of the file name.
    names = file_names(db_path.parent)
    assert db_path.name in names
    assert f"{db_path.name}{query}" not in names


def file_names(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir()}
