"""The store after a failover to an asynchronous standby that had not received the last
grants: opened on the promoted standby, as a restarted replica would, it
finds that the database lost history (a new timeline), raises every epoch past
anything the old primary issued, ends every lease, and opens the recovery window;
once, whichever replica finds it first; until an operator closes it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest

from core.records import Refusal
from policies.model import StorePool
from store import Admitted, NewEffect, Store, UnknownKey, open_store
from store.history import FAILOVER_EPOCH_ADVANCE
from store.postgres import PostgresConnector
from tests.pgstandby import StandbyPair

pytestmark = pytest.mark.timeout(90)

POOL = StorePool(1, 2)
TTL_S = 300.0


@pytest.fixture
def pair() -> Iterator[StandbyPair]:
    with StandbyPair() as started:
        yield started


async def opened(url: str, instance: str) -> Store:
    store = open_store(url, lambda: 0.0, instance, POOL)
    await store.open()
    return store


@pytest.fixture
async def closing() -> AsyncIterator[list[Store]]:
    stores: list[Store] = []
    yield stores
    for store in stores:
        await store.close()


async def grant(store: Store, resource: str, holder: str) -> int:
    granted = await store.acquire(resource, holder, TTL_S, f"token-{holder}")
    assert not isinstance(granted, Refusal), granted
    return granted[0].epoch


def order(key: str) -> NewEffect:
    return NewEffect(
        route="place-order",
        resource="r:1",
        idempotency_key=key,
        fingerprint=f"fp-{key}",
        method="POST",
        path=f"/orders/{key}",
        max_in_flight=1,
        upstream_timeout_s=1.0,
        retain_s=60,
    )


async def test_a_promoted_async_standby_is_recovered_once_and_never_reissues_an_epoch(
    pair: StandbyPair, closing: list[Store]
) -> None:
    primary = await opened(pair.primary_url, "replica-a")
    closing.append(primary)
    assert primary.recovery is None
    assert await grant(primary, "r:1", "a") == 1
    pair.wait_caught_up()
    pair.detach_standby()
    # Acknowledged by the primary, never on the standby: A's release, B's epoch 2.
    released = await primary.release("token-a")
    assert not isinstance(released, Refusal)
    assert await grant(primary, "r:1", "b") == 2
    await primary.close()
    closing.remove(primary)
    pair.crash_primary()
    pair.promote()

    # Two replicas restarting at once: one recovers, the other waits for it and
    # finds it done (once: the epochs advance once).
    first, racing = await asyncio.gather(
        opened(pair.standby_url, "replica-a"), opened(pair.standby_url, "replica-b")
    )
    closing.extend((first, racing))
    window = first.recovery
    assert window is not None and "timeline 2" in window.reason, window
    assert racing.recovery == window
    # A's lease, alive again on the standby, is over; the next epoch is above 2.
    view = await first.lease_view("r:1")
    assert not view.live, view
    assert 2 + FAILOVER_EPOCH_ADVANCE <= view.next_epoch < 2 * FAILOVER_EPOCH_ADVANCE, view
    assert await grant(first, "r:1", "c") == view.next_epoch

    # In the window a key the store does not know is unknown, not new: nothing recorded.
    unknown = await first.admit("token-c", order("k-lost"))
    assert isinstance(unknown, UnknownKey) and unknown.window == window
    assert await first.effects(resource="r:1") == []
    # Once the upstream says it never saw it: admitted, and known from then on.
    admitted = await first.admit("token-c", order("k-lost"), key_cleared=True)
    assert isinstance(admitted, Admitted), admitted
    again = await first.admit("token-c", order("k-lost"))
    assert not isinstance(again, UnknownKey | Admitted), again

    # Another replica restarting finds the loss already recovered: nothing ended again.
    second = await opened(pair.standby_url, "replica-c")
    closing.append(second)
    assert second.recovery == window
    assert (await second.lease_view("r:1")).live

    assert await second.close_recovery()
    assert second.recovery is None
    assert await first.refresh_recovery() is None
    third = await opened(pair.standby_url, "replica-d")
    closing.append(third)
    assert third.recovery is None


async def test_the_store_says_whether_its_standby_is_synchronous(
    pair: StandbyPair, closing: list[Store]
) -> None:
    store = await opened(pair.primary_url, "replica-a")
    closing.append(store)
    replication = store.replication
    assert replication is not None and replication.standbys == 1
    assert replication.warning() is not None
    pair.make_synchronous()
    await store.refresh_recovery()
    assert store.replication is not None and store.replication.warning() is None


async def test_a_new_connection_checks_the_history_again(
    pair: StandbyPair, closing: list[Store]
) -> None:
    """A reconnect without a restart (the pool opens a new connection, to whatever now
    answers at the address) finds the loss too: here the store's record says it wrote
    on another timeline than the server's, as on a standby promoted behind the same
    address."""
    store = await opened(pair.primary_url, "replica-a")
    closing.append(store)
    assert await grant(store, "r:1", "a") == 1
    await admin_execute(pair.primary_url, "UPDATE store_meta SET history_timeline = 7")
    connector = store.connector
    assert isinstance(connector, PostgresConnector)
    # As a server that went away does: every pooled connection is opened anew.
    assert connector._pool is not None
    await connector._pool.expire_connections()
    view = await store.lease_view("r:1")
    assert store.recovery is not None and "timeline 7" in store.recovery.reason
    assert not view.live and view.next_epoch > FAILOVER_EPOCH_ADVANCE, view


async def admin_execute(url: str, sql: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def test_a_role_refused_the_wal_functions_opens_the_store_and_is_warned(
    pair: StandbyPair, closing: list[Store], caplog: pytest.LogCaptureFixture
) -> None:
    """Where the WAL position may not be read (a role, or a managed service, refused
    pg_walfile_name), the store still works; it says it cannot detect a failover."""
    for sql in (
        "CREATE ROLE app LOGIN",
        "GRANT CREATE ON SCHEMA public TO app",
        "REVOKE EXECUTE ON FUNCTION pg_walfile_name(pg_lsn) FROM PUBLIC",
    ):
        await admin_execute(pair.primary_url, sql)
    store = await opened(pair.primary_url.replace("postgres@", "app@"), "replica-a")
    closing.append(store)
    assert await grant(store, "r:1", "a") == 1
    assert store.recovery is None
    assert "a failover that lost history cannot be detected" in caplog.text
