"""`fenceproxy store fence-restore` after restoring the store from a backup.

A backup taken at epoch 3 knows nothing of epochs 4 and 5, issued (and written
under) after it. Restored as is, the store would issue epoch 4 again, and a
new holder's writes would carry an epoch the upstream already saw from
another. After `fence-restore --yes`, every token issued before the restore is
refused, whether the backup knows it (epochs 1-3) or not (4-5), and every
epoch issued afterwards — on old resources and new ones — is above anything
issued before.

PostgreSQL: a hot backup with pg_dump (custom format) restored by pg_restore
into a fresh database; without those tools, a copy made with CREATE DATABASE
... TEMPLATE while the proxy is stopped. SQLite: the database file copied while
the proxy is stopped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import pg
from tests.integration.replicas.conftest import Api, Fleet, Proxy, api_for

pytestmark = pytest.mark.timeout(90)

RESOURCE = "r:restored"
TARGET = "restored"
TTL_S = 300.0
TOOL_TIMEOUT_S = 60.0

pg_restored_url = pg.database_fixture()


async def take_epoch(api: Api, proxy: Proxy, epoch: int, tokens: dict[int, str]) -> None:
    """Release the current lease (if any) and acquire the next epoch."""
    if epoch - 1 in tokens:
        released = await api.release(proxy, tokens[epoch - 1])
        assert released.status == 200, released
    granted = await api.acquire(proxy, RESOURCE, f"holder-{epoch}", TTL_S)
    assert granted.status == 201, granted
    assert granted.body["epoch"] == epoch, granted
    tokens[epoch] = granted.body["token"]


async def write(api: Api, proxy: Proxy, token: str) -> tuple[int, str | None]:
    answer = await api.place_order(proxy, TARGET, token, f"restore-{uuid.uuid4().hex}")
    return answer.status, answer.code


def fence_restore(fleet: Fleet, config: Path, *extra: str) -> int:
    """Run the installed CLI; refuses without --yes, then advances; returns the floor."""
    refused = fleet.cli(config, "store", "fence-restore", *extra)
    assert refused.returncode != 0, refused
    assert "--yes" in refused.stderr, refused
    done = fleet.cli(config, "store", "fence-restore", "--yes", "--json", *extra)
    assert done.returncode == 0, (done.stdout, done.stderr)
    floor: int = json.loads(done.stdout)["epoch_floor"]
    return floor


async def before_backup(api: Api, proxy: Proxy, tokens: dict[int, str]) -> None:
    for epoch in (1, 2, 3):
        await take_epoch(api, proxy, epoch, tokens)
    assert await write(api, proxy, tokens[3]) == (201, None)


async def after_backup(api: Api, proxy: Proxy, tokens: dict[int, str]) -> None:
    """Epochs 4 and 5, which the backup will not know, and a write under 5."""
    for epoch in (4, 5):
        await take_epoch(api, proxy, epoch, tokens)
    assert await write(api, proxy, tokens[5]) == (201, None)


async def check_restored(api: Api, proxy: Proxy, tokens: dict[int, str], floor: int) -> None:
    assert floor > 5
    for epoch, token in sorted(tokens.items()):
        status, code = await write(api, proxy, token)
        # The backup knows epochs 1-3 (now ended and below the floor), not 4-5.
        expected = "stale_epoch" if epoch <= 3 else "invalid_token"
        assert code == expected, (epoch, status, code)
        renewed = await api.renew(proxy, token, TTL_S)
        assert renewed.code == expected, (epoch, renewed)

    # fence-restore ended the lease at epoch 3 the backup holds: no wait for it.
    view = await api.lease(proxy, RESOURCE)
    assert view.body["live"] is False and view.body["epoch"] == floor, view
    granted = await api.acquire(proxy, RESOURCE, "after-restore", TTL_S)
    assert granted.status == 201, granted
    assert granted.body["epoch"] == floor + 1, granted
    fresh = await api.acquire(proxy, "r:created-after-restore", "after-restore", TTL_S)
    assert fresh.status == 201, fresh
    assert fresh.body["epoch"] == floor + 1, fresh

    assert await write(api, proxy, granted.body["token"]) == (201, None)
    landed = [int(e["fence_epoch"]) for e in await api.upstream_effects() if e["target"] == TARGET]
    # Every epoch the upstream saw grows, across the restore too.
    assert landed == [3, 5, floor + 1], landed


def run_tool(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    assert done.returncode == 0, (argv[0], done.stdout, done.stderr)


def postgres_backup(
    fleet: Fleet, proxy: Proxy, source_url: str, restored_url: str
) -> tuple[Proxy, Callable[[], str]]:
    """Take a backup of `source_url` now. Returns the proxy (restarted if the backup
    needed it stopped) and a function that restores the backup and returns its URL."""
    pg_dump, pg_restore = shutil.which("pg_dump"), shutil.which("pg_restore")
    if pg_dump is not None and pg_restore is not None:
        dump = fleet.tmp_path / "backup.dump"
        run_tool(pg_dump, "--format=custom", f"--file={dump}", f"--dbname={source_url}")

        def restore_dump() -> str:
            run_tool(
                pg_restore, "--no-owner", "--exit-on-error", f"--dbname={restored_url}", str(dump)
            )
            return restored_url

        return proxy, restore_dump
    # No client tools: copy the database, which needs it without connections.
    proxy.process.terminate()
    copy_url = pg.create_database(template=pg.database_name(source_url))
    fleet.cleanup(pg.drop_database, copy_url)
    restarted = fleet.spawn_proxy(proxy.name, proxy.config_path, proxy.port)
    fleet.wait_ready(restarted)
    return restarted, lambda: copy_url


async def test_fence_restore_on_postgresql(pg_url: str, pg_restored_url: str, fleet: Fleet) -> None:
    fleet.start_upstream()
    proxy = fleet.start_proxy("before", pg_url)
    tokens: dict[int, str] = {}
    async with api_for(fleet) as api:
        await before_backup(api, proxy, tokens)
        proxy, restore = postgres_backup(fleet, proxy, pg_url, pg_restored_url)
        await after_backup(api, proxy, tokens)
    fleet.stop_proxies()

    config, port = fleet.write_config("restored", restore())
    floor = fence_restore(fleet, config)
    assert floor == 3 + 1_000_000  # the default --advance past the backup's highest epoch
    restored = fleet.spawn_proxy("restored", config, port)
    fleet.wait_ready(restored)
    async with api_for(fleet) as api:
        await check_restored(api, restored, tokens, floor)


async def test_fence_restore_on_sqlite(fleet: Fleet) -> None:
    fleet.start_upstream()
    live = fleet.tmp_path / "fence.db"
    proxy = fleet.start_proxy("before", f"sqlite:///{live}")
    tokens: dict[int, str] = {}
    async with api_for(fleet) as api:
        await before_backup(api, proxy, tokens)
        # The backup: the database file, copied while the proxy is stopped.
        proxy.process.terminate()
        backup = copy_sqlite(live, fleet.tmp_path / "backup.db")
        proxy = fleet.spawn_proxy(proxy.name, proxy.config_path, proxy.port)
        fleet.wait_ready(proxy)
        await after_backup(api, proxy, tokens)
    fleet.stop_proxies()

    restored_db = copy_sqlite(backup, fleet.tmp_path / "restored.db")
    config, port = fleet.write_config("restored", f"sqlite:///{restored_db}")
    floor = fence_restore(fleet, config, "--advance", "10")
    assert floor == 3 + 10
    restored = fleet.spawn_proxy("restored", config, port)
    fleet.wait_ready(restored)
    async with api_for(fleet) as api:
        await check_restored(api, restored, tokens, floor)


def copy_sqlite(source: Path, target: Path) -> Path:
    """Copy a SQLite database whose writers are stopped, with its WAL if one is left."""
    for suffix in ("", "-wal"):
        if Path(f"{source}{suffix}").exists():
            shutil.copyfile(f"{source}{suffix}", f"{target}{suffix}")
    return target
