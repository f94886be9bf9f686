"""A PostgreSQL store replaced under the open pool (issue 8, item 5): every transaction
reads the store's id with the clock, in the same round trip, and a store that is no
longer the one opened answers nothing more."""

from __future__ import annotations

import pytest

from store import Store, StoreUnavailable
from tests.integration.app import backends
from tests.integration.app.backends import Backend
from tests.integration.app.conftest import FakeClock
from tests.integration.app.test_store_contract import acquire, granted, running_store


@pytest.fixture
def backend() -> Backend:
    return "postgresql"


async def on_the_side(store_url: str, sql: str) -> None:
    """One statement on a connection of its own (another process, an operator)."""
    conn = await backends._connect(store_url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def assert_lost(store: Store, what: str) -> None:
    with pytest.raises(StoreUnavailable, match=what):
        await acquire(store, "after")
    with pytest.raises(StoreUnavailable, match=what):
        await store.lease_view("before")
    with pytest.raises(StoreUnavailable, match=what):
        await store.heartbeat()


async def test_another_store_behind_the_same_url_refuses_everything_for_good(
    store_url: str, clock: FakeClock
) -> None:
    async with running_store(store_url, clock) as store:
        granted(await acquire(store, "before"))
        opened = (await store.identity()).store_id
        # What a database dropped, created again and migrated looks like from here.
        await on_the_side(store_url, "UPDATE store_identity SET store_id = 'another-store'")
        await assert_lost(store, "now another-store")
        # Putting the id back does not make what happened meanwhile trustworthy.
        await on_the_side(store_url, f"UPDATE store_identity SET store_id = '{opened}'")
        await assert_lost(store, "now another-store")


async def test_a_schema_dropped_under_the_pool_is_unavailable_not_a_bug(
    store_url: str, clock: FakeClock
) -> None:
    async with running_store(store_url, clock) as store:
        granted(await acquire(store, "before"))
        await on_the_side(
            store_url,
            "DO $$ DECLARE s text := current_schema(); BEGIN"
            " EXECUTE format('DROP SCHEMA %I CASCADE', s);"
            " EXECUTE format('CREATE SCHEMA %I', s); END $$",
        )
        await assert_lost(store, "its tables are gone")
