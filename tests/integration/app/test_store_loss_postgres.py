"""A PostgreSQL store replaced under the open pool: every transaction
reads the store's id with the clock, in the same round trip, and a store that is no
longer the one opened answers nothing more."""

from __future__ import annotations

import pytest

from core.lifecycle import Event
from core.records import EffectRecord
from store import Admitted, NewEffect, Store, StoreUnavailable
from tests.integration.app import backends
from tests.integration.app.backends import Backend
from tests.integration.app.conftest import FakeClock
from tests.integration.app.test_store_contract import (
    acquire,
    granted,
    new_token_hash,
    running_store,
)


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


async def admitted_effect(store: Store) -> tuple[str, EffectRecord]:
    token_hash = new_token_hash()
    granted(await store.acquire("fenced", "w", 30, token_hash))
    new = NewEffect("route", "fenced", "k-1", "fp", "POST", "/x", 1, 5.0, 60.0)
    decision = await store.admit(token_hash, new)
    assert isinstance(decision, Admitted), decision
    return token_hash, decision.effect


async def receipt_as_admitted(store: Store, effect: EffectRecord) -> None:
    await store.finish_effect(
        effect.id, Event.ANSWERED_COMMITTED, 201, "201", None, admitted=effect
    )


async def test_a_receipt_in_one_statement_checks_the_store_and_writes_nothing_to_another(
    store_url: str, clock: FakeClock
) -> None:
    async with running_store(store_url, clock) as store:
        _, effect = await admitted_effect(store)
        await on_the_side(store_url, "UPDATE store_identity SET store_id = 'another-store'")

        with pytest.raises(StoreUnavailable, match="now another-store"):
            await receipt_as_admitted(store, effect)

        assert await backends.rows(
            store_url, "SELECT state FROM effects WHERE id = ?", (effect.id,)
        ) == [("DISPATCHING",)]
        await assert_lost(store, "now another-store")


async def test_an_admission_reads_the_store_id_with_its_records(
    store_url: str, clock: FakeClock
) -> None:
    async with running_store(store_url, clock) as store:
        token_hash, _ = await admitted_effect(store)
        await on_the_side(store_url, "UPDATE store_identity SET store_id = 'another-store'")

        with pytest.raises(StoreUnavailable, match="now another-store"):
            await store.admit(
                token_hash, NewEffect("route", "fenced", "k-2", "fp", "POST", "/x", 1, 5.0, 60.0)
            )

        assert await backends.rows(store_url, "SELECT count(*) FROM effects") == [(1,)]


async def test_a_receipt_after_the_schema_was_dropped_is_unavailable_not_a_bug(
    store_url: str, clock: FakeClock
) -> None:
    async with running_store(store_url, clock) as store:
        _, effect = await admitted_effect(store)
        await on_the_side(
            store_url,
            "DO $$ DECLARE s text := current_schema(); BEGIN"
            " EXECUTE format('DROP SCHEMA %I CASCADE', s);"
            " EXECUTE format('CREATE SCHEMA %I', s); END $$",
        )

        with pytest.raises(StoreUnavailable, match="its tables are gone"):
            await receipt_as_admitted(store, effect)
