"""A store lost under the proxy, or swapped while it was down.

The proxy and the demo upstream are real OS processes. The tests delete the
proxy's SQLite files with os.unlink while it runs, cap its file size with
prlimit(RLIMIT_FSIZE) (a full disk: CPython ignores SIGXFSZ, so writes fail with
EFBIG instead of killing it), and restart it on an empty or another store. Judged
by what the proxy answers and by the upstream's own count of the requests that
reached it.
"""

from __future__ import annotations

import json
import resource
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.integration.processes.conftest import (
    FENCEPROXY_CLI,
    Stack,
    assert_refused,
    http_call,
    wait_until,
)

READY_WITHIN_S = 5.0


def new_key(label: str) -> str:
    return f"{label}-{secrets.token_hex(6)}"


def store_files(stack: Stack) -> list[Path]:
    return sorted(stack.tmp_path.glob("fence.db*"))


def readyz_status(stack: Stack) -> int:
    return http_call(stack.proxy_url, "GET", "/_fence/readyz").status


def ordered_once(stack: Stack, sku: str) -> dict[str, Any]:
    """A lease on supplier:SKU and one acknowledged order under it; returns the lease,
    with the order's key as "idempotency_key"."""
    lease = stack.acquire_ok(f"supplier:{sku}", "worker-a", ttl_s=30.0)
    key = new_key("before")
    placed = stack.place_order(sku, lease["token"], key)
    assert placed.status == 201, placed
    return {**lease, "idempotency_key": key}


def refused_start(stack: Stack, *extra_args: str) -> str:
    """Start the proxy, which must exit 1 before listening; its last log line."""
    stack.restart_proxy(*extra_args, wait_ready=False)
    status = stack.wait_proxy_exit(30.0)
    assert status == 1, stack.proxy.log_tail()
    assert not stack.proxy_accepts_connections()
    last = stack.proxy.log_tail().splitlines()[-1]
    return last


def test_deleting_the_store_files_under_a_running_proxy_refuses_writes_and_readiness(
    stack: Stack,
) -> None:
    """Signal: os.unlink of fence.db, -wal and -shm while the proxy runs (`rm fence.db*`).
    Proves: the next write is 503 store_unavailable and never reaches the upstream, a
    lease grant and a read are refused too, and /readyz turns 503."""
    lease = ordered_once(stack, "deleted")
    assert readyz_status(stack) == 200
    files = store_files(stack)
    assert stack.tmp_path / "fence.db" in files and stack.tmp_path / "fence.db-wal" in files
    for path in files:
        path.unlink()

    after = stack.place_order("deleted", lease["token"], new_key("after"))

    assert_refused(after, 503, "store_unavailable")
    assert stack.upstream_mutations_received() == 1, "a write reached the upstream after the loss"
    assert stack.upstream_orders() == 1
    assert_refused(stack.acquire("supplier:other", "worker-b", 5.0), 503, "store_unavailable")
    lease_view = http_call(stack.proxy_url, "GET", "/_fence/v1/leases?resource=supplier:deleted")
    assert_refused(lease_view, 503, "store_unavailable")
    wait_until("/readyz to say not ready", lambda: readyz_status(stack) == 503, READY_WITHIN_S)
    assert_refused(http_call(stack.proxy_url, "GET", "/_fence/readyz"), 503, "store_unavailable")
    # Nothing recreated the files behind the proxy's back.
    assert not (stack.tmp_path / "fence.db").exists()


def test_a_store_that_cannot_take_writes_is_not_ready(stack: Stack) -> None:
    """Signal: prlimit(RLIMIT_FSIZE, 1 byte) on the running proxy: every write to a file
    fails (EFBIG), reads still work — a full disk. Proves: /readyz is 503
    store_unavailable within a second or so (a read would still pass), a write is refused
    before the upstream sees it, and readiness comes back once writes work again."""
    lease = ordered_once(stack, "full")
    assert readyz_status(stack) == 200
    unlimited = resource.prlimit(stack.proxy.pid, resource.RLIMIT_FSIZE)
    resource.prlimit(stack.proxy.pid, resource.RLIMIT_FSIZE, (1, unlimited[1]))
    try:
        wait_until("/readyz to say not ready", lambda: readyz_status(stack) == 503, READY_WITHIN_S)
        problem = assert_refused(
            http_call(stack.proxy_url, "GET", "/_fence/readyz"), 503, "store_unavailable"
        )
        assert problem["status"] == 503
        # Reads still work: this is what the old read-only readiness saw.
        assert stack.lease("supplier:full")["epoch"] == 1
        refused = stack.place_order("full", lease["token"], new_key("full"))
        assert_refused(refused, 503, "store_unavailable")
        assert stack.upstream_mutations_received() == 1
    finally:
        resource.prlimit(stack.proxy.pid, resource.RLIMIT_FSIZE, unlimited)
    wait_until("/readyz to say ready again", lambda: readyz_status(stack) == 200, READY_WITHIN_S)
    placed = stack.place_order("full", lease["token"], new_key("again"))
    assert placed.status == 201, placed


def test_a_restart_on_an_empty_store_is_refused_until_fence_restore(stack: Stack) -> None:
    """Signal: SIGTERM, then `rm fence.db*`, then a start on the same config. Proves: the
    proxy refuses to start with one line naming the situation and both ways out; the
    same key is not ordered again; after `store fence-restore` it starts and epochs
    continue above every acknowledged one."""
    old_lease = ordered_once(stack, "emptied")
    stack.sigterm_proxy()
    assert stack.wait_proxy_exit(15.0) == 0
    for path in store_files(stack):
        path.unlink()

    line = refused_start(stack)

    assert line.startswith("fenceproxy: the store sqlite:///"), line
    assert "last used" in line and "fence-restore" in line and "--new-store" in line, line
    assert stack.upstream_orders() == 1

    restored = stack.cli("store", "fence-restore", "--yes")
    assert restored.returncode == 0, (restored.stdout, restored.stderr)
    stack.restart_proxy()
    # The old holder's retry of its acknowledged key is not ordered again: its token
    # is unknown to this store.
    retry = stack.place_order("emptied", old_lease["token"], old_lease["idempotency_key"])
    assert_refused(retry, 403, "invalid_token")
    lease = stack.acquire_ok("supplier:emptied", "worker-b", ttl_s=30.0)
    assert lease["epoch"] > 1_000_000, lease
    assert stack.upstream_orders() == 1
    assert readyz_status(stack) == 200


def test_a_restart_on_another_store_is_refused_until_new_store(stack: Stack) -> None:
    """Signal: SIGTERM, then fence.db replaced by another fenceproxy store (made by the
    installed CLI elsewhere and moved in), then a start. Proves: refused with the one
    line; `serve --new-store` starts on it; the next plain restart accepts it (the
    instance now remembers it)."""
    ordered_once(stack, "swapped")
    stack.sigterm_proxy()
    assert stack.wait_proxy_exit(15.0) == 0
    assert stack.config_path is not None
    other_dir = stack.tmp_path / "other"
    other_dir.mkdir()
    other_config = other_dir / "other.yaml"
    other_config.write_text(
        stack.config_path.read_text().replace(
            str(stack.tmp_path / "fence.db"), str(other_dir / "o.db")
        )
    )
    made = subprocess.run(
        [str(FENCEPROXY_CLI), "store", "migrate", "--config", str(other_config)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    for path in store_files(stack):
        path.unlink()
    shutil.move(other_dir / "o.db", stack.tmp_path / "fence.db")

    line = refused_start(stack)
    assert "is not the store" in line and "--new-store" in line, line

    stack.restart_proxy("--new-store")
    assert stack.acquire_ok("supplier:swapped", "worker-b", ttl_s=30.0)["epoch"] == 1
    stack.sigterm_proxy()
    assert stack.wait_proxy_exit(15.0) == 0
    stack.restart_proxy()
    assert readyz_status(stack) == 200


def test_the_state_dir_holds_the_instance_memory_away_from_the_store(stack: Stack) -> None:
    """Signal: SIGTERM, then starts with `--state-dir`. Proves: by default the memory is
    next to the SQLite file under a name `rm fence.db*` does not match; `--state-dir`
    keeps it elsewhere, where a later start with the same directory checks it."""
    ordered_once(stack, "state")
    (default,) = stack.tmp_path.glob("fenceproxy-instance-*.json")
    assert default not in store_files(stack)
    stack.sigterm_proxy()
    assert stack.wait_proxy_exit(15.0) == 0
    elsewhere = stack.tmp_path / "elsewhere"

    stack.restart_proxy("--state-dir", str(elsewhere))

    (moved,) = elsewhere.glob("fenceproxy-instance-*.json")
    assert moved.name == default.name
    assert json.loads(moved.read_text())["store_id"] == json.loads(default.read_text())["store_id"]
    stack.sigterm_proxy()
    assert stack.wait_proxy_exit(15.0) == 0
    for path in store_files(stack):
        path.unlink()
    line = refused_start(stack, "--state-dir", str(elsewhere))
    assert "is not the store" in line, line
