"""A failover under running replicas whose store URL names both servers, with real
processes: the primary and its asynchronous standby (tests/pgstandby.py), two proxy
replicas on `postgresql://…@primary,standby/…` (asyncpg's default
target_session_attrs=any), the demo upstream counting its own effects.

The primary dies; the replicas' pools reconnect to the standby while it is still in
recovery; then it is promoted, and the replicas go on without a restart. Those
connections must not carry on as if the history were the same: the recovery window
opens (readyz, log), the lost epoch is never granted again, and the upstream never
sees a key twice or one epoch from two holders.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator

import pytest
import yaml

from tests.integration.replicas.conftest import Api, Fleet, Proxy, api_for, call, eventually
from tests.pgstandby import StandbyPair

pytestmark = pytest.mark.timeout(60)

TARGET = "u"  # PUT /rules/u: a route without a probe
RESOURCE = f"r:{TARGET}"
TTL_S = 60.0
WAIT_S = 20.0
OK = (200, 201)


@pytest.fixture
def pair() -> Iterator[StandbyPair]:
    with StandbyPair() as started:
        yield started


def one_connection_replica(fleet: Fleet, name: str, store_url: str) -> Proxy:
    """A replica whose pool holds one connection: the one it reconnects with while the
    standby is in recovery is the one it goes on with once it is promoted (a larger
    pool may open a fresh one after the promotion, which hides nothing)."""
    config_path, port = fleet.write_config(name, store_url, timeout_s=1.0, settle_s=1.0)
    config = yaml.safe_load(config_path.read_text())
    config["store_pool"] = {"min_size": 1, "max_size": 1}
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return fleet.spawn_proxy(name, config_path, port)


async def readyz(api: Api, proxy: Proxy) -> tuple[int, dict[str, object] | None]:
    async with api.session.get(f"{proxy.url}/_fence/readyz") as response:
        body = await response.json() if response.status == 200 else None
        return response.status, body


async def test_replicas_on_both_servers_recover_when_the_standby_they_reached_is_promoted(
    pair: StandbyPair, fleet: Fleet
) -> None:
    fleet.start_upstream()
    replicas = [one_connection_replica(fleet, f"r{number}", pair.both_url) for number in (0, 1)]
    fleet.wait_ready(*replicas)
    first, second = replicas
    async with api_for(fleet) as api:
        a = await api.acquire(first, RESOURCE, "a", TTL_S)
        assert a.status == 201 and a.body["epoch"] == 1, a
        first_write = await api.put_rule(first, TARGET, a.body["token"], "a.1", {"by": "a"})
        assert first_write.status in OK, first_write
        await asyncio.to_thread(pair.wait_caught_up)
        await asyncio.to_thread(pair.detach_standby)
        # Acknowledged by the primary only: A's release, B's epoch 2 and its write k2.
        assert (await api.release(first, a.body["token"])).status == 200
        b = await api.acquire(second, RESOURCE, "b", TTL_S)
        assert b.status == 201 and b.body["epoch"] == 2, b
        written = await api.put_rule(second, TARGET, b.body["token"], "k2", {"by": "b"})
        assert written.status in OK, written
        await asyncio.to_thread(pair.crash_primary)

        # The pools reconnect to the standby, still in recovery: not ready (once the
        # heartbeat readyz caches is due again), and not used for anything meanwhile.
        async def not_ready() -> bool:
            return all([(await readyz(api, replica))[0] == 503 for replica in replicas])

        await eventually("both replicas not ready on the standby", not_ready, WAIT_S)
        refused = await api.acquire(first, RESOURCE, "d", TTL_S)
        assert refused.code == "store_unavailable", refused
        await asyncio.to_thread(pair.promote)

        async def windows_open() -> bool:
            for replica in replicas:
                status, body = await readyz(api, replica)
                if status != 200 or body is None or "recovery_window" not in body:
                    return False
            return True

        await eventually("the recovery window on both replicas", windows_open, WAIT_S)
        logs = "".join(replica.process.log_tail(200) for replica in replicas)
        assert "the store lost history" in logs

        # A's release was lost with the old primary: its lease is over all the same.
        assert (await api.release(first, a.body["token"])).status != 200
        c = await api.acquire(first, RESOURCE, "c", TTL_S)
        assert c.status == 201 and c.body["epoch"] > 2, c
        # B's key sent again by its successor: the store lost it, so, with no probe on
        # this route, it is refused in the window rather than applied again.
        again = await api.put_rule(first, TARGET, c.body["token"], "k2", {"by": "c"})
        assert again.status == 503 and again.code == "recovery_window", again
        # The operator closes the window (the writes in flight accounted for): C writes.
        closed = await call(
            api.session,
            "POST",
            f"{first.url}/_fence/v1/admin/close-recovery",
            json_body={},
            headers={"Authorization": f"Bearer {fleet.admin_token}"},
        )
        assert closed.status == 200, closed
        new = await api.put_rule(first, TARGET, c.body["token"], "c.1", {"by": "c"})
        assert new.status in OK, new
        upstream = await api.upstream_effects()

    applied: dict[str, int] = defaultdict(int)
    for effect in upstream:
        applied[effect["idempotency_key"]] += 1
    assert {key: n for key, n in applied.items() if n > 1} == {}
    epochs = [int(effect["fence_epoch"]) for effect in upstream if effect["target"] == TARGET]
    # One write per epoch here, each epoch one holder's, never going back.
    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs), epochs
