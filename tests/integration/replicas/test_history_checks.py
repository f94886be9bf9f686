"""The history check on every transaction, against real PostgreSQL servers
(tests/pgstandby.py), with the store open through them as a running replica's is: no
restart, the pool reconnecting to whatever answers at the store URL.

* A pool that reconnects to the standby while the primary is down uses none of those
  connections while the standby is in recovery, and once it is promoted finds the lost
  history on them (a store URL naming both servers).
* An old primary coming back as a primary (never rewound) after a recovery on the
  promoted standby is lost history too: an older timeline than the last seen.
* A database restored in place from a snapshot, same timeline, is found on the next
  transaction, since the position kept advances with every commit; and the floors are
  raised again even though a recovery window (of the snapshot's time) is open; behind a
  pooler's open connections too, in session and in transaction mode.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from core.records import Refusal
from policies.model import StorePool
from store import Store, StoreUnavailable, open_store
from store.history import FAILOVER_EPOCH_ADVANCE
from tests.pgbouncer import Bouncer, PoolMode
from tests.pgstandby import StandbyPair

pytestmark = pytest.mark.timeout(60)

POOL = StorePool(1, 2, acquire_timeout_s=5.0, command_timeout_s=5.0)
NO_CACHE = StorePool(1, 2, statement_cache=False, acquire_timeout_s=5.0, command_timeout_s=5.0)
TTL_S = 300.0
# Operations tried while a server goes away or comes back: each fails fast.
ATTEMPTS = 40


@pytest.fixture
async def closing() -> AsyncIterator[list[Store]]:
    stores: list[Store] = []
    yield stores
    for store in stores:
        await store.close()


async def opened(url: str, closing: list[Store]) -> Store:
    store = open_store(url, lambda: 0.0, "replica-a", POOL)
    await store.open()
    closing.append(store)
    return store


async def grant(store: Store, resource: str, holder: str) -> int:
    granted = await store.acquire(resource, holder, TTL_S, f"token-{holder}")
    assert not isinstance(granted, Refusal), granted
    return granted[0].epoch


async def admin(url: str, sql: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def until_it_answers(store: Store, resource: str) -> bool:
    """Read `resource`'s lease until the store answers (its pool reconnects); whether
    any read was refused as unavailable on the way."""
    refused = False
    for _ in range(ATTEMPTS):
        try:
            await store.lease_view(resource)
            return refused
        except StoreUnavailable:
            refused = True
    raise AssertionError("the store never answered")


async def test_a_pool_reconnected_to_a_standby_uses_it_only_once_promoted_and_recovers(
    closing: list[Store],
) -> None:
    with StandbyPair() as pair:
        store = await opened(pair.both_url, closing)
        assert await grant(store, "r:1", "a") == 1
        pair.wait_caught_up()
        pair.detach_standby()
        # Acknowledged by the primary only: A's release and B's epoch 2.
        assert not isinstance(await store.release("token-a"), Refusal)
        assert await grant(store, "r:1", "b") == 2
        pair.crash_primary()

        # The pool reconnects to the standby, still in recovery: nothing is served
        # from it, not even a read.
        for _ in range(3):
            with pytest.raises(StoreUnavailable):
                await store.lease_view("r:1")
        pair.promote()

        # The same running store, on connections to the promoted standby: lost history.
        await until_it_answers(store, "r:1")
        assert store.recovery is not None and "timeline 2" in store.recovery.reason
        # A's lease, alive again on the standby, is over; epoch 2 is never granted again.
        assert isinstance(await store.release("token-a"), Refusal)
        assert await grant(store, "r:1", "c") > FAILOVER_EPOCH_ADVANCE


async def test_an_old_primary_back_on_its_old_timeline_is_lost_history(
    closing: list[Store],
) -> None:
    with StandbyPair() as pair:
        store = await opened(pair.both_url, closing)
        assert await grant(store, "r:1", "a") == 1
        pair.wait_caught_up()
        pair.crash_primary()
        pair.promote()
        await until_it_answers(store, "r:1")
        assert store.recovery is not None and "timeline 2" in store.recovery.reason
        b_epoch = await grant(store, "r:1", "b")
        assert b_epoch > FAILOVER_EPOCH_ADVANCE

        # The old primary comes back as a primary, never rewound; the promoted one goes
        # away: the pool's new connections reach the old one, where A's lease is live.
        pair.start_old_primary()
        pair.stop_standby()
        await until_it_answers(store, "r:1")
        assert store.recovery is not None and "timeline 1" in store.recovery.reason
        renewed = await store.renew("token-a", TTL_S)
        assert isinstance(renewed, Refusal), renewed
        # Above every epoch this replica saw granted on the newer timeline.
        assert await grant(store, "r:1", "c") > b_epoch


async def test_a_restore_in_place_is_found_on_the_next_transaction_even_with_a_window_open(
    closing: list[Store],
) -> None:
    with StandbyPair(standby=False) as pair:
        store = await opened(pair.primary_url, closing)
        # A recovery window still open from an earlier loss, in the snapshot too.
        await admin(
            pair.primary_url,
            "UPDATE store_meta SET recovery_opened_at = 1, recovery_reason = 'an earlier loss'",
        )
        await store.refresh_recovery()
        assert store.recovery is not None
        assert await grant(store, "r:1", "a") == 1
        pair.snapshot()
        assert not isinstance(await store.release("token-a"), Refusal)
        granted = await grant(store, "r:1", "b")
        assert granted == 2
        pair.restore()

        await until_it_answers(store, "r:1")
        assert store.recovery is not None and "went back" in store.recovery.reason
        assert isinstance(await store.renew("token-a", TTL_S), Refusal)
        assert await grant(store, "r:1", "c") > FAILOVER_EPOCH_ADVANCE


@pytest.mark.parametrize("mode", ["session", "transaction"])
async def test_a_restore_behind_a_poolers_open_connections_is_found(
    mode: PoolMode, closing: list[Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """pgbouncer keeps the store's client connections open while the server behind it
    is restored and restarted: no connection of the store's pool is opened again, and in
    transaction mode each transaction may run on another server connection. The check
    is the transaction's, so the next one finds the loss either way."""
    with StandbyPair(standby=False) as pair:
        # The pooler in front of this primary, not of the tests' shared server.
        monkeypatch.setattr("tests.pgbouncer.pg.require_admin_url", lambda: pair.primary_url)
        with Bouncer(mode, pool_size=2) as bouncer:
            url = bouncer.url(pair.primary_url)
            store = open_store(url, lambda: 0.0, "replica-a", NO_CACHE)
            await store.open()
            closing.append(store)
            assert await grant(store, "r:1", "a") == 1
            pair.snapshot()
            assert not isinstance(await store.release("token-a"), Refusal)
            assert await grant(store, "r:1", "b") == 2
            pair.restore()

            await until_it_answers(store, "r:1")
            assert store.recovery is not None and "went back" in store.recovery.reason
            assert isinstance(await store.renew("token-a", TTL_S), Refusal)
            assert await grant(store, "r:1", "c") > FAILOVER_EPOCH_ADVANCE
