"""The migrator's check before a contraction (a migration declaring `-- oldest release:`,
core/releases.py), on both backends: refused while a replica older than it declares
has written its row within the window, naming it; the migrating instance's own row (its
last life on an older release) is not a peer."""

from __future__ import annotations

import time

import pytest

from store import ReleaseRefused, Store, open_store
from store.base import SchemaTx
from store.schema import refuse_while_needed


async def check_contraction(store: Store, oldest_release: str) -> None:
    """What the migrator asks before applying migration 0025 drop_x, declared
    `-- oldest release: <oldest_release>`, in a schema transaction as it does."""

    async def operation(tx: SchemaTx) -> None:
        await refuse_while_needed(tx, store.connector, 25, "drop_x", oldest_release)

    await store.connector.change_schema(operation)


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
