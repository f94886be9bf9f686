"""A replica stopped between a fenced request's cancellation and its UNKNOWN receipt
never lets a second effect through on the resource, with real processes.

Replica A runs with FENCEPROXY_FAILPOINTS=cancelled:once. Worker-1's order goes
through A to a slow upstream; A is told to stop (SIGTERM), and once its grace is over
the handler still waiting for the upstream is cancelled: A stops itself (SIGSTOP)
right there, before the receipt that would record the effect UNKNOWN. The effect is
DISPATCHING in the store, and the upstream commits the order meanwhile. Through
replica B, on the same PostgreSQL store, worker-1's retry of its key and another of
its writes are refused, and worker-2 is refused a lease (worker-1's, then, once that
has run out, the effect in doubt): nothing more reaches the upstream until B's sweep
finds the effect past its deadline and its probe settles it COMMITTED (the upstream's
own record of the key). Then worker-2's lease and order go through, and A,
continued, finishes its stop: whether its receipt comes late or not at all (the stop
went on while A was stopped, and may close its store first), it changes nothing. The
demo upstream, in its own process, is the judge of what landed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import aiohttp
import pytest

from core import failpoints
from demo.upstream import DELAY_HEADER
from tests.integration.replicas.conftest import (
    Api,
    Fleet,
    Proxy,
    api_for,
    call,
    eventually,
    resource_of,
)

UPSTREAM_TIMEOUT_S = 5.0
# Longer than A's grace (1 s, tests/integration/replicas/conftest.py), with seconds to
# spare on a loaded machine: the upstream is still working on the order when A's
# handler is cancelled.
UPSTREAM_DELAY_MS = 3500
# Worker-1's lease: long enough for the upstream timeout (else lease_too_short), short
# enough to run out while A is stopped.
LEASE_S = 6
# The sweep (deadline + margin), the settle window and the probe: seconds; generous.
SETTLE_WAIT_S = 40.0


async def orders(api: Api, sku: str) -> list[tuple[str, str]]:
    """(idempotency key, fence epoch) of each order the upstream committed for `sku`,
    in its commit order: its own records."""
    return [
        (e["idempotency_key"], e["fence_epoch"])
        for e in await api.upstream_effects()
        if e["target"] == sku
    ]


async def arrived(api: Api, key: str) -> bool:
    return bool((await api.upstream_headers_seen())["last_headers"].get("idempotency-key") == key)


async def test_a_replica_stopped_after_its_handler_was_cancelled_keeps_the_resource_blocked(
    pg_url: str, fleet: Fleet
) -> None:
    fleet.start_upstream()
    a_config, a_port = fleet.write_config("a", pg_url, timeout_s=UPSTREAM_TIMEOUT_S)
    b_config, b_port = fleet.write_config("b", pg_url, timeout_s=UPSTREAM_TIMEOUT_S)
    a = fleet.spawn_proxy("a", a_config, a_port, env={failpoints.ENV: "cancelled:once"})
    b = fleet.spawn_proxy("b", b_config, b_port)
    fleet.wait_ready(a, b)
    sku = "cancelled"
    k1, k2 = f"k1-{uuid.uuid4().hex}", f"k2-{uuid.uuid4().hex}"
    async with api_for(fleet) as api:
        first = await api.acquire(b, resource_of(sku), "worker-1", ttl_s=LEASE_S)
        assert first.status == 201, first
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        try:
            headers = {
                "Fence-Token": first.body["token"],
                "Idempotency-Key": k1,
                DELAY_HEADER: str(UPSTREAM_DELAY_MS),
            }
            worker = asyncio.create_task(
                call(
                    session, "POST", f"{a.url}/orders/{sku}", json_body={"qty": 1}, headers=headers
                )
            )
            await eventually("worker-1's order to reach the upstream", lambda: arrived(api, k1), 15)
            os.kill(a.process.pid, signal.SIGTERM)  # not waited for: it stops on the way

            async def a_stopped() -> bool:
                return a.process.is_stopped()

            await eventually("A to stop itself after the cancellation", a_stopped, 15.0)
            try:
                [effect] = await api.effects(b, resource=resource_of(sku))
                assert effect["state"] == "DISPATCHING", effect
                await blocked_until_settled(api, b, sku, effect["id"], first.body["token"], k1, k2)
            finally:
                a.process.resume()
            # A stops with its request cut off: the worker is told nothing.
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await worker
        finally:
            await session.close()
        assert await orders(api, sku) == [(k1, "1"), (k2, "2")]

        async def a_exited() -> bool:
            return not a.process.is_running()

        await eventually("A to exit", a_exited, 15.0)
        assert a.process.returncode == 0, a.process.log_tail()
        # Whether A's receipt came late or not at all (its stop went on while it was
        # stopped, and may have closed its store first), the probe's word stands.
        receipt = await api.effect(b, effect["id"])
        assert (receipt["state"], receipt["settled_by"]) == ("COMMITTED", "probe"), receipt


LEASE_TTL_S = 120


async def blocked_until_settled(
    api: Api, b: Proxy, sku: str, effect_id: str, first_token: str, k1: str, k2: str
) -> None:
    """Through B, worker-1's retry of its key and another of its writes are refused,
    and worker-2 gets no lease (and so writes nothing) while the effect is in doubt;
    once it is settled COMMITTED, worker-2's lease and order go through."""
    for key in (k1, f"other-{k1}"):
        retried = await api.place_order(b, sku, first_token, key)
        assert retried.code in ("request_in_progress", "effect_in_flight"), retried
    blocked = 0

    async def granted() -> bool:
        nonlocal blocked
        state = (await api.effect(b, effect_id))["state"]
        second = await api.acquire(b, resource_of(sku), "worker-2", ttl_s=LEASE_TTL_S)
        if second.status == 201:
            # Read again: B's prober may have settled it between the read above and the
            # grant. Settled before the grant, by the store's own clock, not just by now.
            settled = await api.effect(b, effect_id)
            granted_at = second.body["expires_at"] - LEASE_TTL_S
            assert settled["state"] == "COMMITTED", (settled, second)
            assert settled["finished_at"] <= granted_at + 1e-6, (settled, second)
            assert second.body["epoch"] == 2, second
            written = await api.place_order(b, sku, second.body["token"], k2)
            assert written.status == 201, written
            return True
        # Worker-1's lease until it runs out, then the effect in doubt.
        assert second.code in ("lease_held", "resource_blocked"), second
        assert state in ("DISPATCHING", "UNKNOWN"), state
        blocked += second.code == "resource_blocked"
        assert await orders(api, sku) == [(k1, "1")] or await orders(api, sku) == []
        return False

    await eventually("B to settle the effect and grant worker-2 a lease", granted, SETTLE_WAIT_S)
    assert blocked > 0
