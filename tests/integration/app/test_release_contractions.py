"""The migrator's check before a contraction (a migration declaring `-- oldest release:`,
core/releases.py), on both backends: refused while a replica older than it declares
has written its row within the window, naming it; the migrating instance's own row (its
last life on an older release) is not a peer."""

from __future__ import annotations

import time

import pytest

from store import ReleaseRefused, Store, open_store
from store.postgres import PostgresConnector
from store.sqlite import SQLiteConnector


async def check_contraction(store: Store, oldest_release: str) -> None:
    connector = store.connector
    if isinstance(connector, PostgresConnector):
        assert connector._pool is not None
        async with connector._pool.acquire() as conn:
            await connector._check_contraction(conn, 25, "drop_x", oldest_release)
    else:
        assert isinstance(connector, SQLiteConnector)
        assert connector._writer is not None
        await connector._check_contraction(connector._writer, 25, "drop_x", oldest_release)


async def test_a_contraction_waits_for_the_replicas_older_than_it_declares(
    store_url: str,
) -> None:
    migrating = open_store(store_url, time.time, "replica-a")
    other = open_store(store_url, time.time, "replica-b")
    await migrating.open()
    await other.open()
    try:
        await migrating.record_replica("0.1.0", 1.0, None, None)
        await check_contraction(migrating, "0.2.0")  # its own row only
        await other.record_replica("0.1.0", 1.0, None, None)
        with pytest.raises(ReleaseRefused) as refused:
            await check_contraction(migrating, "0.2.0")
        assert "migration 0025 drop_x removes what releases before 0.2.0 use" in str(refused.value)
        assert "replica-b (0.1.0)" in str(refused.value)
        assert "replica-a" not in str(refused.value)
        await check_contraction(migrating, "0.1.0")
        await other.record_replica("0.2.0", 1.0, None, None)
        await check_contraction(migrating, "0.2.0")
    finally:
        await other.close()
        await migrating.close()
