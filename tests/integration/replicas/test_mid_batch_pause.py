"""A replica paused in the middle of a batch (group commit), its transaction open,
lands no stale or doubled write, and each write of the batch is judged at its own
time, with real processes.

Replica A has one write lane (a pool of two) and FENCEPROXY_FAILPOINTS=mid_batch:once.
The test holds the row lock of another resource, so that A's admission there holds the
lane while three more queue: worker-1's order on X, worker-2's on Y and worker-4's on
Z, whose leases end in 2 s. The lock let go, A runs the three as one batch, X's
admission first (the batch's resource order), and stops itself (SIGSTOP) before Y's:
X's admission written, not committed, X's row lock held. Meanwhile the lease
authority goes on through replica B: the leases on Y and Z expire, worker-3 takes Y
at epoch 2 and writes through B; nobody takes Z. Then A is continued. The demo
upstream, in its own process, is the only judge of what landed.

* Y's admission runs after the pause and reads Y as it stands then, at epoch 2,
  granted meanwhile: refused (stale epoch), nothing forwarded, so no write of epoch 1
  lands after epoch 2's.
* Z's admission is judged at its own time (`clock_timestamp()`), after the pause, not
  when the batch began, when worker-4's lease was still live: refused (lease
  expired), nothing forwarded.
* X's admission was judged before the pause and commits after it: its send deadline
  has passed meanwhile, so A sends nothing and settles it NOT_SENT; worker-1's retry
  of the key through B (its lease is a long one) lands once.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

import aiohttp
import asyncpg
import yaml

from core import failpoints
from tests.integration.replicas.conftest import (
    Answer,
    Api,
    Fleet,
    Proxy,
    api_for,
    call,
    eventually,
    resource_of,
)
from tests.integration.replicas.test_send_deadline import orders

UPSTREAM_TIMEOUT_S = 1.0
SEND_WINDOW_S = 1.0
SHORT_LEASE_S = 2.0
WAIT_S = 15.0


def with_one_write_lane(config_path: Path) -> None:
    """A pool of two: one write lane (store/postgres.py write_lanes), one for reads."""
    config = yaml.safe_load(config_path.read_text())
    config["store_pool"] = {"min_size": 1, "max_size": 2}
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))


def start_pair(fleet: Fleet, pg_url: str) -> tuple[Proxy, Proxy]:
    fleet.start_upstream()
    a_config, a_port = fleet.write_config(
        "a", pg_url, timeout_s=UPSTREAM_TIMEOUT_S, send_window_s=SEND_WINDOW_S
    )
    with_one_write_lane(a_config)
    b_config, b_port = fleet.write_config(
        "b", pg_url, timeout_s=UPSTREAM_TIMEOUT_S, send_window_s=SEND_WINDOW_S
    )
    a = fleet.spawn_proxy(
        "a", a_config, a_port, env={failpoints.ENV: f"{failpoints.MID_BATCH}:once"}
    )
    b = fleet.spawn_proxy("b", b_config, b_port)
    fleet.wait_ready(a, b)
    return a, b


async def writes_queued(api: Api, proxy: Proxy) -> int:
    answer = await call(
        api.session,
        "GET",
        f"{proxy.url}/_fence/metrics",
        headers={"Authorization": f"Bearer {api.fleet.admin_token}"},
    )
    assert answer.status == 200, answer
    found = re.search(r"^fenceproxy_store_writes_queued (\S+)$", answer.body, re.MULTILINE)
    assert found is not None, answer.body
    return int(float(found.group(1)))


async def test_a_replica_paused_mid_batch_judges_each_write_at_its_own_time(
    pg_url: str, fleet: Fleet
) -> None:
    a, b = start_pair(fleet, pg_url)
    tag = uuid.uuid4().hex[:8]
    # In resource order: x before y, so the batch stops between X's write and Y's.
    hold, x, y, z = f"hold-{tag}", f"mb-x-{tag}", f"mb-y-{tag}", f"mb-z-{tag}"
    async with api_for(fleet) as api:
        leases = {}
        for sku, holder, ttl_s in ((hold, "worker-0", 60), (x, "worker-1", 60)):
            leases[sku] = await api.acquire(b, resource_of(sku), holder, ttl_s=ttl_s)
        leases[y] = await api.acquire(b, resource_of(y), "worker-2", ttl_s=SHORT_LEASE_S)
        leases[z] = await api.acquire(b, resource_of(z), "worker-4", ttl_s=SHORT_LEASE_S)
        assert all(lease.status == 201 for lease in leases.values()), leases
        kx, ky, kz, k_hold = f"kx-{tag}", f"ky-{tag}", f"kz-{tag}", f"kh-{tag}"
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        locker = await asyncpg.connect(pg_url)
        watcher = await asyncpg.connect(pg_url)
        workers: dict[str, asyncio.Task[Answer]] = {}

        def order(sku: str, key: str) -> asyncio.Task[Answer]:
            headers = {"Fence-Token": leases[sku].body["token"], "Idempotency-Key": key}
            return asyncio.create_task(
                call(session, "POST", f"{a.url}/orders/{sku}", json_body={}, headers=headers)
            )

        try:
            async with locker.transaction():
                await locker.execute(
                    "SELECT 1 FROM resources WHERE resource = $1 FOR UPDATE", resource_of(hold)
                )
                workers[hold] = order(hold, k_hold)

                locker_pid = await locker.fetchval("SELECT pg_backend_pid()")

                async def lane_waits_for_the_lock() -> bool:
                    waiting = await watcher.fetchval(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE $1 = ANY(pg_blocking_pids(pid))",
                        locker_pid,
                    )
                    return bool(waiting)

                await eventually(
                    "A's admission to wait for the lock", lane_waits_for_the_lock, WAIT_S
                )
                workers[x], workers[y], workers[z] = order(x, kx), order(y, ky), order(z, kz)

                async def all_queued() -> bool:
                    return await writes_queued(api, a) == 3

                await eventually("X's, Y's and Z's admissions to queue on A", all_queued, WAIT_S)
            # The lock let go: A's batch of X and Y runs, and stops between them.

            async def a_stopped() -> bool:
                return a.process.is_stopped()

            await eventually("A to stop between the batch's writes", a_stopped, WAIT_S)
            try:
                # X's row lock is A's until it is continued; Y's is free, and the
                # authority goes on: worker-2's lease ends, worker-3 writes at epoch 2.
                async def y_granted() -> bool:
                    lease = await api.acquire(b, resource_of(y), "worker-3", ttl_s=60)
                    if lease.status == 201:
                        leases["y2"] = lease
                    return lease.status == 201

                await eventually("worker-2's lease on Y to end", y_granted, WAIT_S)
                assert leases["y2"].body["epoch"] == 2, leases["y2"]
                written = await api.place_order(b, y, leases["y2"].body["token"], f"ky2-{tag}")
                assert written.status == 201, written
            finally:
                a.process.resume()
            answers = {
                sku: await asyncio.wait_for(task, WAIT_S * 2) for sku, task in workers.items()
            }
        finally:
            await locker.close()
            await watcher.close()
            await session.close()

        # Its request was on its way upstream when A stopped, past its timeout: applied
        # (201), or unknown to A (504) and probed; once either way.
        assert answers[hold].status in (201, 504), answers[hold]
        assert await orders(api, hold) == [(k_hold, "1")]
        # Judged after the pause: worker-3's epoch 2 stands, nothing forwarded.
        assert answers[y].status == 409, answers[y]
        assert answers[y].code == "stale_epoch", answers[y]
        assert await orders(api, y) == [(f"ky2-{tag}", "2")]
        assert answers[z].status == 409, answers[z]
        assert answers[z].code == "lease_expired", answers[z]
        assert await orders(api, z) == []
        # Judged before the pause, committed after it: too late to send.
        assert answers[x].status == 502, answers[x]
        assert answers[x].code == "upstream_unreachable", answers[x]
        assert "send deadline" in answers[x].body["detail"], answers[x]
        assert await orders(api, x) == []
        # The key, freed by the NOT_SENT receipt, is retried through B and lands once.
        [effect] = await api.effects(b, resource=resource_of(x))
        assert effect["state"] == "NOT_SENT", effect
        retried = await api.place_order(b, x, leases[x].body["token"], kx)
        assert retried.status == 201, retried
        assert await orders(api, x) == [(kx, "1")]
