"""A replica paused between its admission and its send never lands a stale or doubled
write (the send deadline), with real processes.

Replica A runs with FENCEPROXY_FAILPOINTS=admitted:once: the first fenced write it
admits stops it (SIGSTOP, as a GC or VM pause would) right after the admission's
COMMIT answer, with the effect DISPATCHING. Replica B, on the same PostgreSQL store,
sweeps the effect to UNKNOWN once it is past its deadline, probes the upstream
(404: not committed) and settles it NOT_COMMITTED, which frees the resource and the
key. Then A is continued. The demo upstream, in its own process, is the only judge
of what landed.

* Row 1: worker-1's lease has expired meanwhile and worker-2 wrote under epoch 2
  through B: A's write, under epoch 1, must not land after it.
* Row 1b: worker-1 (a long lease) retried its key through B, and that write landed:
  A's must not land a second time.

Before the send deadline, A sent its request as soon as it was continued: the
upstream held epoch 1's write after epoch 2's (row 1), and the key's write twice
(row 1b). Now A finds its send deadline passed, on its own monotonic clock, sends
nothing, settles the effect NOT_SENT (an agreeing late receipt on NOT_COMMITTED)
and tells the worker that nothing was sent.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp
import asyncpg

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

UPSTREAM_TIMEOUT_S = 1.0
SEND_WINDOW_S = 1.0
# Sweep (deadline + margin), probe and settle: a few seconds; the bound is generous.
SETTLE_WAIT_S = 30.0


def start_pair(fleet: Fleet, pg_url: str) -> tuple[Proxy, Proxy]:
    """Replica A, which stops itself after its first admission, and replica B."""
    fleet.start_upstream()
    a_config, a_port = fleet.write_config(
        "a", pg_url, timeout_s=UPSTREAM_TIMEOUT_S, send_window_s=SEND_WINDOW_S
    )
    b_config, b_port = fleet.write_config(
        "b", pg_url, timeout_s=UPSTREAM_TIMEOUT_S, send_window_s=SEND_WINDOW_S
    )
    a = fleet.spawn_proxy(
        "a", a_config, a_port, env={failpoints.ENV: f"{failpoints.ADMITTED}:once"}
    )
    b = fleet.spawn_proxy("b", b_config, b_port)
    fleet.wait_ready(a, b)
    return a, b


async def orders(api: Api, sku: str) -> list[tuple[str, str]]:
    """(idempotency key, fence epoch) of each order the upstream committed for `sku`,
    in its commit order: its own records."""
    return [
        (e["idempotency_key"], e["fence_epoch"])
        for e in await api.upstream_effects()
        if e["target"] == sku
    ]


async def paused_after_admission(
    api: Api, a: Proxy, b: Proxy, sku: str, token: str, key: str
) -> tuple[asyncio.Task[Answer], dict[str, Any], aiohttp.ClientSession]:
    """Worker-1's order sent through A, which stops itself once it is admitted; then
    B's sweep and probe settle the effect NOT_COMMITTED. Returns the worker's request
    (on a session of its own: A answers only once continued), and the effect."""
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
    headers = {"Fence-Token": token, "Idempotency-Key": key}
    worker = asyncio.create_task(
        call(session, "POST", f"{a.url}/orders/{sku}", json_body={"qty": 1}, headers=headers)
    )

    async def a_stopped() -> bool:
        return a.process.is_stopped()

    await eventually("A to stop itself after the admission", a_stopped, 15.0)
    [effect] = await api.effects(b, resource=resource_of(sku))
    assert effect["state"] == "DISPATCHING", effect

    async def settled() -> bool:
        receipt = await api.effect(b, effect["id"])
        assert receipt["state"] in ("DISPATCHING", "UNKNOWN", "NOT_COMMITTED"), receipt
        return bool(receipt["state"] == "NOT_COMMITTED")

    await eventually("B to sweep, probe and settle the effect", settled, SETTLE_WAIT_S)
    return worker, effect, session


async def told_nothing_was_sent(api: Api, b: Proxy, answer: Answer, effect_id: str) -> None:
    assert answer.status == 502, answer
    assert answer.code == "upstream_unreachable", answer
    assert "nothing was sent" in answer.body["detail"], answer
    assert "send deadline" in answer.body["detail"], answer
    receipt = await api.effect(b, effect_id)
    # The late NOT_SENT receipt agrees with the probe: audited, nothing changed.
    assert receipt["state"] == "NOT_COMMITTED", receipt
    assert receipt["events"][-1]["conclusion"] == "late", receipt


async def test_a_replica_paused_after_admission_never_lands_a_write_after_the_next_epochs(
    pg_url: str, fleet: Fleet
) -> None:
    a, b = start_pair(fleet, pg_url)
    sku = "stale"
    async with api_for(fleet) as api:
        first = await api.acquire(b, resource_of(sku), "worker-1", ttl_s=2)
        assert first.status == 201, first
        k1, k2 = f"k1-{uuid.uuid4().hex}", f"k2-{uuid.uuid4().hex}"
        worker, effect, session = await paused_after_admission(
            api, a, b, sku, first.body["token"], k1
        )
        try:
            second = await api.acquire(b, resource_of(sku), "worker-2", ttl_s=30)
            assert second.status == 201, second  # worker-1's lease has expired
            assert second.body["epoch"] == 2, second
            written = await api.place_order(b, sku, second.body["token"], k2)
            assert written.status == 201, written
            assert await orders(api, sku) == [(k2, "2")]
        finally:
            a.process.resume()
        try:
            answer = await worker
        finally:
            await session.close()
        assert await orders(api, sku) == [(k2, "2")]
        await told_nothing_was_sent(api, b, answer, effect["id"])


async def test_a_replica_paused_after_admission_never_lands_a_retried_key_twice(
    pg_url: str, fleet: Fleet
) -> None:
    a, b = start_pair(fleet, pg_url)
    sku = "double"
    async with api_for(fleet) as api:
        lease = await api.acquire(b, resource_of(sku), "worker-1", ttl_s=120)
        assert lease.status == 201, lease
        token = lease.body["token"]
        k1 = f"k1-{uuid.uuid4().hex}"
        worker, effect, session = await paused_after_admission(api, a, b, sku, token, k1)
        try:
            # The probe freed the key: the worker's retry through B is a new send.
            retried = await api.place_order(b, sku, token, k1)
            assert retried.status == 201, retried
            assert await orders(api, sku) == [(k1, "1")]
        finally:
            a.process.resume()
        try:
            answer = await worker
        finally:
            await session.close()
        assert await orders(api, sku) == [(k1, "1")]
        await told_nothing_was_sent(api, b, answer, effect["id"])


async def test_the_failpoints_stop_a_replica_where_they_say(pg_url: str, fleet: Fleet) -> None:
    """`before_send`: connected, nothing written yet; `sent`: the upstream has answered,
    the receipt is not written yet (the effect is still DISPATCHING)."""
    fleet.start_upstream()
    config, port = fleet.write_config("a", pg_url, timeout_s=5.0, send_window_s=5.0)
    spec = f"{failpoints.BEFORE_SEND}:once,{failpoints.SENT}:once"
    a = fleet.spawn_proxy("a", config, port, env={failpoints.ENV: spec})
    fleet.wait_ready(a)
    sku = "points"
    async with api_for(fleet) as api:
        lease = await api.acquire(a, resource_of(sku), "worker-1", ttl_s=60)
        assert lease.status == 201, lease
        key = f"k-{uuid.uuid4().hex}"
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        try:
            headers = {"Fence-Token": lease.body["token"], "Idempotency-Key": key}
            worker = asyncio.create_task(
                call(session, "POST", f"{a.url}/orders/{sku}", json_body={}, headers=headers)
            )

            async def a_stopped() -> bool:
                return a.process.is_stopped()

            await eventually("A to stop before its send", a_stopped, 15.0)
            assert (await api.upstream_headers_seen())["last_headers"] == {}
            assert await orders(api, sku) == []
            a.process.resume()
            await eventually("A to stop after the upstream's answer", a_stopped, 15.0)
            assert await orders(api, sku) == [(key, "1")]
            # A answers nothing while stopped, so the effect is read from the database.
            conn = await asyncpg.connect(pg_url)
            try:
                state = await conn.fetchval(
                    "SELECT state FROM effects WHERE idempotency_key = $1", key
                )
            finally:
                await conn.close()
            assert state == "DISPATCHING"
            a.process.resume()
            answer = await worker
        finally:
            await session.close()
        assert answer.status == 201, answer
