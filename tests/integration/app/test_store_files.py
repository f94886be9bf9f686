"""store/files.py and the lease view's next_epoch on both stores: what `store migrate`
reports and what `leases show` says a resource's next epoch is after fence-restore."""

from __future__ import annotations

from proxy.presentation import lease_view_json
from store.files import schema_versions
from store.queries import load_migrations
from tests.integration.app.backends import backend_of
from tests.integration.app.conftest import FakeClock
from tests.integration.app.test_store_contract import acquire, granted, running_store


async def test_schema_versions_are_none_before_the_store_exists_then_every_migration(
    store_url: str, clock: FakeClock
) -> None:
    folder = "sqlite" if backend_of(store_url) == "sqlite" else "postgresql"
    assert await schema_versions(store_url) == set()
    async with running_store(store_url, clock):
        pass
    assert await schema_versions(store_url) == {v for v, _, _ in load_migrations(folder)}


async def test_a_resource_never_leased_shows_the_epoch_it_will_get_after_fence_restore(
    store_url: str, clock: FakeClock
) -> None:
    async with running_store(store_url, clock) as store:
        assert (await store.lease_view("never")).next_epoch == 1
        granted(await acquire(store, "leased"))
        assert (await store.lease_view("leased")).next_epoch == 2

        floor = await store.fence_restore(1000)

        never = await store.lease_view("never")
        assert (never.epoch, never.next_epoch) == (0, floor + 1)
        assert lease_view_json(never)["next_epoch"] == floor + 1
        assert granted(await acquire(store, "never")).epoch == floor + 1
        assert (await store.lease_view("leased")).next_epoch == floor + 1
