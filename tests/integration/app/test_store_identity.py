"""The store's identity and the instance's memory of it, on both backends: a
proxy instance never starts on a store it does not know, unless the store
was fenced after the instance last started or the operator said `--new-store`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.identity import (
    IdentityCheck,
    StoreIdentityRefused,
    check_store_identity,
    default_state_dir,
    memory_file,
    redacted,
)
from store import StoreError
from tests.integration.app.conftest import FakeClock
from tests.integration.app.test_store_contract import acquire, granted, running_store


def remember(memory: Path, store_id: str, started_at: float) -> None:
    memory.write_text(json.dumps({"store_id": store_id, "started_at": started_at}))


def remembered(memory: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(memory.read_text())
    return data


async def test_the_store_id_is_random_per_store_and_stable_across_opens(
    store_url: str, clock: FakeClock, tmp_path: Path
) -> None:
    async with running_store(store_url, clock) as store:
        first = await store.identity()
    async with running_store(store_url, clock) as store:
        again = await store.identity()
    assert again == first
    assert len(first.store_id) == 32 and first.fenced_at is None
    if store_url.startswith("sqlite:"):
        other_url = f"sqlite:///{tmp_path / 'other.db'}"
        async with running_store(other_url, clock) as other:
            assert (await other.identity()).store_id != first.store_id


async def test_a_first_start_remembers_the_store_and_a_restart_accepts_it(
    store_url: str, clock: FakeClock, tmp_path: Path
) -> None:
    memory = memory_file(tmp_path / "state", "proxy a:8080")
    assert memory.name == "fenceproxy-instance-proxy_a_8080.json"
    async with running_store(store_url, clock) as store:
        assert await check_store_identity(store, IdentityCheck(memory), store_url) is None
        store_id = (await store.identity()).store_id
        assert remembered(memory)["store_id"] == store_id
        assert remembered(memory)["instance_id"] == store.instance_id
        assert await check_store_identity(store, IdentityCheck(memory), store_url) is None


async def test_another_store_is_refused_and_the_memory_is_kept(
    store_url: str, clock: FakeClock, tmp_path: Path
) -> None:
    memory = tmp_path / "memory.json"
    remember(memory, "an-earlier-store", 0.0)
    async with running_store(store_url, clock) as store:
        with pytest.raises(StoreIdentityRefused) as refused:
            await check_store_identity(store, IdentityCheck(memory), store_url)
    message = str(refused.value)
    assert "\n" not in message
    assert "an-earlier-store" in message and "instance-1" in message
    assert "fence-restore" in message and "--new-store" in message
    assert remembered(memory)["store_id"] == "an-earlier-store"


async def test_new_store_accepts_another_store_and_remembers_it(
    store_url: str, clock: FakeClock, tmp_path: Path
) -> None:
    memory = tmp_path / "memory.json"
    remember(memory, "an-earlier-store", 0.0)
    async with running_store(store_url, clock) as store:
        previous = await check_store_identity(store, IdentityCheck(memory, True), store_url)
        assert previous is not None and previous.store_id == "an-earlier-store"
        assert remembered(memory)["store_id"] == (await store.identity()).store_id
        # From now on it is this instance's store: a plain start accepts it.
        assert await check_store_identity(store, IdentityCheck(memory), store_url) is None


async def test_a_store_fenced_after_the_last_start_is_accepted_one_fenced_before_is_not(
    store_url: str, clock: FakeClock, tmp_path: Path
) -> None:
    memory = tmp_path / "memory.json"
    async with running_store(store_url, clock) as store:
        granted(await acquire(store, "r"))
        await store.fence_restore(1000)
        fenced = await store.identity()
        assert fenced.fenced_at is not None
        # The instance started after that fence-restore: it proves nothing about the
        # epochs this instance acknowledged since.
        remember(memory, "an-earlier-store", fenced.fenced_at + 1)
        with pytest.raises(StoreIdentityRefused):
            await check_store_identity(store, IdentityCheck(memory), store_url)
        remember(memory, "an-earlier-store", fenced.fenced_at - 1)
        previous = await check_store_identity(store, IdentityCheck(memory), store_url)
        assert previous is not None and previous.store_id == "an-earlier-store"
        assert remembered(memory)["store_id"] == fenced.store_id


async def test_an_unreadable_memory_is_refused_not_overwritten(
    store_url: str, clock: FakeClock, tmp_path: Path
) -> None:
    memory = tmp_path / "memory.json"
    memory.write_text("not json")
    async with running_store(store_url, clock) as store:
        with pytest.raises(StoreError, match="not a fenceproxy instance memory"):
            await check_store_identity(store, IdentityCheck(memory), store_url)
    assert memory.read_text() == "not json"


async def test_the_heartbeat_is_a_write_of_one_row_per_instance(
    store_url: str, clock: FakeClock
) -> None:
    async with running_store(store_url, clock, instance_id="beating") as store:
        first = await store.heartbeat()
        clock.advance(5)
        second = await store.heartbeat()
    assert second > first


def test_the_memory_lives_away_from_the_store_files() -> None:
    # `rm state/fenceproxy.db*` must not take the memory along.
    assert default_state_dir("sqlite:///state/fenceproxy.db", "config/x.yaml") == Path("state")
    assert not memory_file(Path("state"), "h:8080").name.startswith("fenceproxy.db")
    assert default_state_dir("postgresql://u@h/db", "/etc/fp/x.yaml") == Path("/etc/fp")
    assert redacted("postgresql://u:secret@h:5432/db") == "postgresql://u@h:5432/db"
