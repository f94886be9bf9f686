"""AsyncFenceClient against the real proxy process and the demo upstream: the same
behaviours as test_sync_client.py, with the renewer as a task of the test's loop.

The stack's own helpers (stack.revoke, stack.lease) are blocking calls of a few
milliseconds on local sockets; the loop's renewer simply runs after them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import pytest
from fenceproxy_client import AsyncFenceClient, errors, new_key

from tests.client.conftest import SLOW_WRITE_MS
from tests.integration.processes.conftest import Stack, assert_rejection_recorded

RULE = "r1"
RESOURCE = f"rule:{RULE}"
RULE_PATH = f"/rules/{RULE}"
SKU = "widget"
ORDER_RESOURCE = f"supplier:{SKU}"
WAIT_S = 10.0
POLL_S = 0.02


async def eventually(what: str, condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    """Bounded polling that lets the loop (and so the renewer) run between checks."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(POLL_S)


def renewers_running() -> bool:
    return any((task.get_name() or "").startswith("fence-renew-") for task in asyncio.all_tasks())


@pytest.mark.usefixtures("unreachable_http_proxy")
async def test_the_environment_s_http_proxy_is_not_used_unless_asked(stack: Stack) -> None:
    async with AsyncFenceClient(stack.proxy_url, timeout_s=5.0) as client:
        lease = await client.acquire(RESOURCE, "worker-a", ttl_s=10)
        await lease.release()
    async with AsyncFenceClient(stack.proxy_url, timeout_s=5.0, trust_env=True) as client:
        with pytest.raises(httpx.ConnectError):
            await client.acquire(RESOURCE, "worker-a", ttl_s=10)


async def test_a_worker_acquires_writes_and_releases(stack: Stack) -> None:
    async with (
        AsyncFenceClient(stack.proxy_url, timeout_s=5.0) as client,
        client.lease(RESOURCE, "worker-a", ttl_s=10) as lease,
    ):
        assert (lease.resource, lease.holder, lease.epoch) == (RESOURCE, "worker-a", 1)
        missing = await lease.request("GET", RULE_PATH, raise_for_status=False)
        assert missing.status_code == 404
        written = await lease.request("PUT", RULE_PATH, json={"route_to": "eu-west"})
        assert written.status_code == 200
        assert stack.lease(RESOURCE)["live"] is True
    assert stack.lease(RESOURCE)["live"] is False
    history = stack.upstream_rule_history(RULE)
    assert [(h["rule"], h["fence_epoch"]) for h in history] == [({"route_to": "eu-west"}, "1")]


async def test_a_write_after_a_takeover_raises_stale_epoch(stack: Stack) -> None:
    async with AsyncFenceClient(stack.proxy_url) as client:
        stalled = await client.acquire(RESOURCE, "worker-a", ttl_s=0.5)
        stack.wait_not_live(RESOURCE)
        async with client.lease(RESOURCE, "worker-b", ttl_s=10) as successor:
            await successor.request("PUT", RULE_PATH, json={"route_to": "b"})
            with pytest.raises(errors.StaleEpoch):
                await stalled.request("PUT", RULE_PATH, json={"route_to": "a"})
        assert stalled.lost
    assert_rejection_recorded(stack, RESOURCE, "stale_epoch", holder="worker-a", epoch=1)
    assert [h["rule"] for h in stack.upstream_rule_history(RULE)] == [{"route_to": "b"}]


async def test_waiting_for_a_held_lease_honours_retry_after(stack: Stack) -> None:
    holder = stack.acquire_ok(RESOURCE, "holder", ttl_s=2.0)
    async with AsyncFenceClient(stack.proxy_url) as client:
        with pytest.raises(errors.LeaseHeld):
            await client.acquire(RESOURCE, "worker-a")
        async with client.lease(RESOURCE, "worker-a", ttl_s=5, wait_s=WAIT_S) as lease:
            assert lease.epoch == holder["epoch"] + 1
    asked = sum(r["count"] for r in stack.rejections(RESOURCE) if r["code"] == "lease_held")
    assert 2 <= asked <= 4


async def test_outcome_unknown_then_blocked_then_settled(stack: Stack) -> None:
    """A write outlives the upstream timeout: OutcomeUnknown; a successor is refused
    ResourceBlocked at once, or waits until the probe settles it; the first holder's
    token reads the settlement: COMMITTED, one order upstream."""
    async with AsyncFenceClient(stack.proxy_url) as client:
        async with client.lease(ORDER_RESOURCE, "worker-a", ttl_s=10) as first:
            with pytest.raises(errors.OutcomeUnknown) as unknown:
                await first.request(
                    "POST",
                    f"/orders/{SKU}",
                    json={"qty": 1},
                    idempotency_key=new_key(),
                    headers={"Demo-Delay-Ms": str(SLOW_WRITE_MS)},
                )
        effect_id = unknown.value.effect_id
        with pytest.raises(errors.ResourceBlocked) as blocked:
            await client.acquire(ORDER_RESOURCE, "worker-b")
        assert blocked.value.effect_ids == [effect_id]
        async with client.lease(ORDER_RESOURCE, "worker-b", ttl_s=5, wait_s=WAIT_S):
            pass
        assert await first.wait_settled(effect_id, timeout_s=WAIT_S) == "COMMITTED"
    assert stack.upstream_orders() == 1


async def test_a_lost_answer_is_outcome_unknown_and_settles_committed(stack: Stack) -> None:
    async with (
        AsyncFenceClient(stack.proxy_url, admin_token=stack.admin_token) as client,
        client.lease(ORDER_RESOURCE, "worker-a", ttl_s=10) as lease,
    ):
        with pytest.raises(errors.OutcomeUnknown) as unknown:
            await lease.request(
                "POST",
                f"/orders/{SKU}",
                json={"qty": 1},
                idempotency_key=new_key(),
                headers={"Demo-Drop-Response": "1"},
            )
        effect_id = unknown.value.effect_id
        assert await lease.wait_settled(effect_id, timeout_s=WAIT_S) == "COMMITTED"
        assert await client.wait_settled(effect_id, timeout_s=WAIT_S) == "COMMITTED"
        by_lease, by_admin = await lease.effect(effect_id), await client.effect(effect_id)
        assert by_lease == by_admin
        assert (by_lease.state, by_lease.settled_by, by_lease.next_probe_at) == (
            "COMMITTED",
            "probe",
            None,
        )
    assert stack.upstream_orders() == 1


async def test_a_revocation_during_renewal_makes_the_lease_lost_once(stack: Stack) -> None:
    """The on_lost coroutine is awaited once; renewal ends; a later write is still sent
    and refused."""
    calls: list[str] = []

    async def lost() -> None:
        calls.append("lost")

    async with (
        AsyncFenceClient(stack.proxy_url) as client,
        client.lease(RESOURCE, "worker-a", ttl_s=1.5, renew=True, on_lost=lost) as lease,
    ):
        assert stack.revoke(RESOURCE, "host drained").status == 200
        await eventually("the lease to be known lost", lambda: lease.lost)
        await eventually("the renewer to end", lambda: not renewers_running())
        assert calls == ["lost"]
        with pytest.raises(errors.StaleEpoch):
            await lease.request("PUT", RULE_PATH, json={"route_to": "late"})
    assert calls == ["lost"]
    assert stack.upstream_rule_history(RULE) == []


async def test_renewal_stops_when_progress_stops_and_the_lease_expires(stack: Stack) -> None:
    calls: list[str] = []
    async with AsyncFenceClient(stack.proxy_url) as client:
        lease = await client.acquire(
            RESOURCE,
            "worker-a",
            ttl_s=1.0,
            renew=True,
            progress_timeout_s=0.8,
            on_lost=lambda: calls.append("lost"),
        )
        first_expiry = lease.expires_at

        def working() -> bool:
            lease.progress()
            return lease.expires_at > first_expiry + 1.0

        await eventually("renewals while progress() is called", working)
        assert not lease.lost
        await eventually("the lease to be known lost", lambda: lease.lost)
        await eventually("the renewer to end", lambda: not renewers_running())
        # The client counts its lease from before it asked, so it calls it lost a moment
        # before the proxy's own clock lets it expire, never after.
        await eventually("the proxy to let it expire", lambda: not stack.lease(RESOURCE)["live"])
        assert calls == ["lost"]
        with pytest.raises(errors.LeaseExpired):
            await lease.request("PUT", RULE_PATH, json={"route_to": "hung"})
        await lease.release()
    assert stack.upstream_rule_history(RULE) == []


async def test_an_upstream_error_is_not_a_fence_error(stack: Stack) -> None:
    async with (
        AsyncFenceClient(stack.proxy_url) as client,
        client.lease(RESOURCE, "w", ttl_s=10) as lease,
    ):
        with pytest.raises(errors.UpstreamError) as upstream:
            await lease.request(
                "PUT", RULE_PATH, json={"route_to": "x"}, headers={"Demo-Status": "409"}
            )
        assert upstream.value.response.status_code == 409
        with pytest.raises(errors.NoRoute):
            await lease.request("DELETE", "/nowhere")
