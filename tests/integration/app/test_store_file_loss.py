"""A SQLite store whose files are deleted or replaced under the open connector.
SQLite itself goes on committing into the unlinked inode; the connector must
notice, refuse to acknowledge anything more, and keep refusing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from store import Store, StoreUnavailable
from store.base import Tx
from tests.integration.app.backends import Backend
from tests.integration.app.conftest import FakeClock
from tests.integration.app.test_store_contract import acquire, granted, running_store


@pytest.fixture
def backend() -> Backend:
    return "sqlite"


@pytest.fixture
def db_path(tmp_path: Path, store_url: str) -> Path:
    path = tmp_path / "fence.db"
    assert store_url == f"sqlite:///{path}"
    return path


async def assert_lost(store: Store, what: str) -> None:
    with pytest.raises(StoreUnavailable, match=what):
        await acquire(store, "after")
    with pytest.raises(StoreUnavailable, match=what):
        await store.lease_view("before")
    with pytest.raises(StoreUnavailable, match=what):
        await store.heartbeat()


async def test_deleted_files_refuse_writes_and_reads(
    store_url: str, db_path: Path, clock: FakeClock
) -> None:
    async with running_store(store_url, clock) as store:
        granted(await acquire(store, "before"))
        for path in db_path.parent.glob("fence.db*"):
            path.unlink()
        await assert_lost(store, "was deleted")
    # Refused, not recreated behind the operator's back.
    assert db_path.name not in os.listdir(db_path.parent)


async def test_a_replaced_file_refuses_writes_even_if_it_is_a_fenceproxy_store(
    store_url: str, db_path: Path, clock: FakeClock, tmp_path: Path
) -> None:
    other_url = f"sqlite:///{tmp_path / 'other.db'}"
    async with running_store(other_url, clock):
        pass
    async with running_store(store_url, clock) as store:
        granted(await acquire(store, "before"))
        os.replace(tmp_path / "other.db", db_path)
        await assert_lost(store, "replaced by another file")


async def test_a_deleted_wal_alone_is_noticed(
    store_url: str, db_path: Path, clock: FakeClock
) -> None:
    # Commits since the last checkpoint live only in the -wal: losing it loses them.
    async with running_store(store_url, clock) as store:
        granted(await acquire(store, "before"))
        db_path.with_name("fence.db-wal").unlink()
        await assert_lost(store, "fence.db-wal was deleted")


async def test_a_file_deleted_during_a_batch_fails_that_batch(
    store_url: str, db_path: Path, clock: FakeClock
) -> None:
    """The check after COMMIT: the batch that was running when the file went is not
    acknowledged, although SQLite committed it (into the unlinked file)."""

    async def delete_while_writing(tx: Tx) -> str:
        await tx.execute("set_resource_epoch", resource="during", epoch=3)
        for path in db_path.parent.glob("fence.db*"):
            path.unlink()
        return "committed into a deleted file"

    async with running_store(store_url, clock) as store:
        with pytest.raises(StoreUnavailable, match="was deleted"):
            await store.connector.write(delete_while_writing)


async def test_the_loss_is_final_even_if_the_same_file_comes_back(
    store_url: str, db_path: Path, clock: FakeClock, tmp_path: Path
) -> None:
    """Whatever was acknowledged meanwhile could not be trusted: once lost, always lost
    until a restart (which checks the store's identity)."""
    async with running_store(store_url, clock) as store:
        granted(await acquire(store, "before"))
        moved = tmp_path / "moved.db"
        os.rename(db_path, moved)
        with pytest.raises(StoreUnavailable):
            await acquire(store, "after")
        os.rename(moved, db_path)  # the very same inode again
        await assert_lost(store, "was deleted")
