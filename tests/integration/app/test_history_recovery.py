"""The recovery after lost history is a store operation (store/failover.py
`HistoryWatch.recover`) over named queries, given any transaction: it fences as `store
fence-restore` does (the same function, `fence_all`), opens the recovery window, and is
made once per server. The failovers that call it are tests/integration/replicas/'s."""

from __future__ import annotations

import pytest

from store.failover import Loss
from store.history import FAILOVER_EPOCH_ADVANCE, Position
from store.postgres import PostgresConnector
from tests.integration.app import backends
from tests.integration.app.backends import Backend
from tests.integration.app.conftest import FakeClock
from tests.integration.app.test_store_contract import acquire, granted, running_store


@pytest.fixture
def backend() -> Backend:
    return "postgresql"


async def test_a_recovery_fences_as_fence_restore_and_is_made_once_per_server(
    store_url: str, clock: FakeClock
) -> None:
    async with running_store(store_url, clock) as store:
        lease = granted(await acquire(store, "r", ttl_s=300))
        connector = store.connector
        assert isinstance(connector, PostgresConnector)
        seen = connector.history.seen
        assert seen is not None  # this server's, whose history is taken for lost
        loss = Loss(Position(seen.timeline, seen.lsn), "a test's loss")

        await connector.history.recover(connector.write, loss)

        view = await store.lease_view("r")
        assert not view.live and view.next_epoch == lease.epoch + FAILOVER_EPOCH_ADVANCE + 1
        assert store.recovery is not None and store.recovery.reason == loss.reason
        [(reason, floor)] = await backends.rows(
            store_url,
            "SELECT l.end_reason, m.epoch_floor FROM leases l, store_meta m",
        )
        assert (reason, floor) == ("failover", lease.epoch + FAILOVER_EPOCH_ADVANCE)
        [(fenced_at,)] = await backends.rows(store_url, "SELECT fenced_at FROM store_identity")
        assert fenced_at is not None  # as fence-restore marks it

        # Found again on the same server (another replica, the next connection): made once.
        await connector.history.recover(connector.write, loss)
        assert (await store.lease_view("r")).next_epoch == view.next_epoch
