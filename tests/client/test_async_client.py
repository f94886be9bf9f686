# unasync: async
"""AsyncFenceClient against the real proxy process and the demo upstream, with the
renewer as a task of the test's loop. test_sync_client.py is written from this file
(devtools/unasync_client.py, `make unasync`), so both clients pass the same tests.

Each test plays one behaviour of the client and judges by what the proxy recorded (its
lease view, its rejection log) and the upstream's own records (its rule history and
order count), not by the client's word. The stack's own helpers (stack.revoke,
stack.lease) are blocking calls of a few milliseconds on local sockets; the loop's
renewer simply runs after them.
"""
# unasync: sync
# """FenceClient against the real proxy process and the demo upstream, with the renewer
# as a background thread: the tests of test_async_client.py, made sync.
#
# Each test plays one behaviour of the client and judges by what the proxy recorded (its
# lease view, its rejection log) and the upstream's own records (its rule history and
# order count), not by the client's word.
# """
# unasync: end

from __future__ import annotations

import asyncio
import logging

# unasync: sync
# import threading
# unasync: end
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
DROP_RESPONSE = {"Demo-Drop-Response": "1"}
WAIT_S = 10.0
POLL_S = 0.02


async def eventually(what: str, condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    """Bounded polling that lets the renewer run between checks."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(POLL_S)


def renewers_running() -> bool:
    # unasync: async
    return any((task.get_name() or "").startswith("fence-renew-") for task in asyncio.all_tasks())
    # unasync: sync
    # return any(thread.name.startswith("fence-renew-") for thread in threading.enumerate())
    # unasync: end


async def test_a_worker_acquires_reads_writes_and_releases(stack: Stack) -> None:
    """The five lines of docs/how-to/write-a-worker.md: the write carries the lease's
    epoch upstream, an upstream 404 is returned when asked for, and leaving the block
    releases the lease."""
    async with (
        AsyncFenceClient(stack.proxy_url, timeout_s=5.0) as client,
        client.lease(RESOURCE, "worker-a", ttl_s=10) as lease,
    ):
        assert (lease.resource, lease.holder, lease.epoch) == (RESOURCE, "worker-a", 1)
        assert lease.expires_at > 0
        missing = await lease.request("GET", RULE_PATH, raise_for_status=False)
        assert missing.status_code == 404
        written = await lease.request("PUT", RULE_PATH, json={"route_to": "eu-west"})
        assert written.status_code == 200
        assert stack.lease(RESOURCE)["live"] is True
        assert not lease.lost
    assert stack.lease(RESOURCE)["live"] is False
    history = stack.upstream_rule_history(RULE)
    assert [(h["rule"], h["fence_epoch"]) for h in history] == [({"route_to": "eu-west"}, "1")]


@pytest.mark.usefixtures("unreachable_http_proxy")
async def test_the_environment_s_http_proxy_is_not_used_unless_asked(stack: Stack) -> None:
    """The sidecar is local and every call carries a token: an HTTP_PROXY meant for the
    worker's other traffic must not carry it, unless the worker asks (trust_env)."""
    async with AsyncFenceClient(stack.proxy_url, timeout_s=5.0) as client:
        lease = await client.acquire(RESOURCE, "worker-a", ttl_s=10)
        await lease.release()
    async with AsyncFenceClient(stack.proxy_url, timeout_s=5.0, trust_env=True) as client:
        with pytest.raises(httpx.ConnectError):
            await client.acquire(RESOURCE, "worker-a", ttl_s=10)


async def test_a_write_after_a_takeover_is_sent_and_raises_stale_epoch(stack: Stack) -> None:
    """A's lease expired and B took over: A's late write still goes to the proxy (the
    client does not refuse on its own clock), is refused there, and raises StaleEpoch;
    the upstream has B's write only."""
    async with AsyncFenceClient(stack.proxy_url) as client:
        stalled = await client.acquire(RESOURCE, "worker-a", ttl_s=0.5)
        stack.wait_not_live(RESOURCE)
        assert stalled.lost
        async with client.lease(RESOURCE, "worker-b", ttl_s=10) as successor:
            assert successor.epoch == stalled.epoch + 1
            await successor.request("PUT", RULE_PATH, json={"route_to": "b"})
            with pytest.raises(errors.StaleEpoch) as refused:
                await stalled.request("PUT", RULE_PATH, json={"route_to": "a"})
        assert stalled.lost
    assert refused.value.status == 409
    assert refused.value.code == "stale_epoch"
    assert refused.value.problem["code"] == "stale_epoch"
    assert_rejection_recorded(stack, RESOURCE, "stale_epoch", holder="worker-a", epoch=1)
    history = stack.upstream_rule_history(RULE)
    assert [h["rule"] for h in history] == [{"route_to": "b"}]


async def test_waiting_for_a_held_lease_honours_retry_after(stack: Stack) -> None:
    """wait_s=0 raises LeaseHeld at once; wait_s>0 waits for the holder's lease to end,
    asking again only after the proxy's Retry-After (a backoff of its own would have
    asked five times or more in the holder's 2 s)."""
    holder = stack.acquire_ok(RESOURCE, "holder", ttl_s=2.0)
    async with AsyncFenceClient(stack.proxy_url) as client:
        with pytest.raises(errors.LeaseHeld) as held:
            await client.acquire(RESOURCE, "worker-a", wait_s=0.0)
        assert held.value.retry_after_s is not None and held.value.retry_after_s >= 1
        async with client.lease(RESOURCE, "worker-a", ttl_s=5, wait_s=WAIT_S) as lease:
            assert lease.epoch == holder["epoch"] + 1
    refusals = stack.rejections(RESOURCE)
    asked = sum(r["count"] for r in refusals if r["code"] == "lease_held")
    assert 2 <= asked <= 4, refusals


async def test_a_wait_that_runs_out_raises_the_last_refusal(stack: Stack) -> None:
    stack.acquire_ok(RESOURCE, "holder", ttl_s=30)
    async with AsyncFenceClient(stack.proxy_url) as client:
        with pytest.raises(errors.LeaseHeld):
            await client.acquire(RESOURCE, "worker-a", wait_s=0.3)


async def test_a_lost_answer_raises_outcome_unknown_and_wait_settled_answers(
    stack: Stack,
) -> None:
    """The upstream commits the order and drops the connection: OutcomeUnknown names the
    effect; the holder's token reads it (no admin token) until the probe settles it
    COMMITTED, during and after the lease, as the admin reads it too. Nothing was
    resent: one order upstream."""
    key = new_key()
    async with (
        AsyncFenceClient(stack.proxy_url) as client,
        AsyncFenceClient(stack.proxy_url, admin_token=stack.admin_token) as admin,
    ):
        async with client.lease(ORDER_RESOURCE, "worker-a", ttl_s=10) as lease:
            with pytest.raises(errors.OutcomeUnknown) as unknown:
                await lease.request(
                    "POST",
                    f"/orders/{SKU}",
                    json={"qty": 2},
                    idempotency_key=key,
                    headers=DROP_RESPONSE,
                )
            effect_id = unknown.value.effect_id
            assert effect_id and unknown.value.status == 504
            assert await lease.wait_settled(effect_id, timeout_s=WAIT_S) == "COMMITTED"
        assert await lease.wait_settled(effect_id, timeout_s=WAIT_S) == "COMMITTED"
        assert await admin.wait_settled(effect_id, timeout_s=WAIT_S) == "COMMITTED"
        by_lease, by_admin = await lease.effect(effect_id), await admin.effect(effect_id)
        assert by_lease == by_admin
        assert (by_lease.state, by_lease.settled_by, by_lease.next_probe_at) == (
            "COMMITTED",
            "probe",
            None,
        )
    assert stack.upstream_orders() == 1


async def test_the_admin_client_waits_for_any_effect(stack: Stack) -> None:
    granted = stack.acquire_ok(ORDER_RESOURCE, "worker-a", ttl_s=10)
    lost = stack.place_order(SKU, granted["token"], new_key(), extra_headers=DROP_RESPONSE)
    assert lost.status == 504, lost
    async with AsyncFenceClient(stack.proxy_url, admin_token=stack.admin_token) as admin:
        assert await admin.wait_settled(lost.body["effect_id"], timeout_s=WAIT_S) == "COMMITTED"
        assert (await admin.effect(lost.body["effect_id"])).state == "COMMITTED"
    async with AsyncFenceClient(stack.proxy_url) as anonymous:
        with pytest.raises(ValueError):
            await anonymous.wait_settled(lost.body["effect_id"], timeout_s=WAIT_S)
        with pytest.raises(ValueError):
            await anonymous.effect(lost.body["effect_id"])


async def test_waiting_for_a_blocked_resource_acquires_once_it_is_settled(stack: Stack) -> None:
    """A write outlives the upstream timeout: OutcomeUnknown, and the effect stays in
    doubt until the probe after the settle window finds it. Meanwhile wait_settled does
    not answer, and acquiring raises ResourceBlocked naming it (wait_s=0) or waits until
    it is settled (wait_s>0)."""
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
            with pytest.raises(TimeoutError):
                await first.wait_settled(effect_id, timeout_s=0.2)
            # In doubt, with the proxy's probe schedule: the route has a probe.
            doubt = await first.effect(effect_id)
            recorded = stack.effect(effect_id)
            assert (doubt.id, doubt.state, doubt.settled, doubt.settled_by) == (
                effect_id,
                recorded["state"],
                False,
                None,
            )
            assert doubt.next_probe_at is not None
            assert doubt.next_probe_at >= recorded["created_at"]
        with pytest.raises(errors.ResourceBlocked) as blocked:
            await client.acquire(ORDER_RESOURCE, "worker-b", wait_s=0.0)
        assert blocked.value.effect_ids == [effect_id]
        async with client.lease(ORDER_RESOURCE, "worker-b", ttl_s=5, wait_s=WAIT_S) as successor:
            assert successor.epoch == first.epoch + 1
            assert stack.effect(effect_id)["state"] == "COMMITTED"
        assert await first.wait_settled(effect_id, timeout_s=WAIT_S) == "COMMITTED"
        settled = await first.effect(effect_id)
        assert (settled.state, settled.settled, settled.settled_by, settled.next_probe_at) == (
            "COMMITTED",
            True,
            "probe",
            None,
        )
        assert settled.probe_attempts >= 1
    refused = [r for r in stack.rejections(ORDER_RESOURCE) if r["code"] == "resource_blocked"]
    assert sum(r["count"] for r in refused) >= 2, refused
    assert stack.upstream_orders() == 1


async def test_renewal_keeps_the_lease_past_its_ttl(stack: Stack) -> None:
    async with AsyncFenceClient(stack.proxy_url) as client:
        async with client.lease(RESOURCE, "worker-a", ttl_s=1.0, renew=True) as lease:
            first_expiry = lease.expires_at
            await eventually(
                "two renewals past the first ttl", lambda: lease.expires_at > first_expiry + 1.0
            )
            assert stack.lease(RESOURCE)["live"] is True
            assert not lease.lost
            await lease.request("PUT", RULE_PATH, json={"route_to": "renewed"})
        assert not renewers_running()


async def test_a_revocation_during_renewal_makes_the_lease_lost_once(stack: Stack) -> None:
    """The renewer's next renewal is refused (stale_epoch): lost becomes true, on_lost
    is called once and renewal ends; a later write is still sent and refused."""
    calls: list[str] = []

    # unasync: async
    # A coroutine function: the async client awaits what on_lost returns.
    # unasync: end
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
    """While progress() is called the lease is renewed past its ttl; once it is not
    called for progress_timeout_s renewal stops, the proxy lets the lease expire, and
    the client says so (lost, on_lost once)."""
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
    """A 4xx or 5xx relayed from the upstream raises UpstreamError with the response (or
    is returned with raise_for_status=False); a refusal of the proxy is a FenceError."""
    async with (
        AsyncFenceClient(stack.proxy_url) as client,
        client.lease(RESOURCE, "w", ttl_s=10) as lease,
    ):
        conflict = {"Demo-Status": "409"}
        with pytest.raises(errors.UpstreamError) as upstream:
            await lease.request("PUT", RULE_PATH, json={"route_to": "x"}, headers=conflict)
        assert not isinstance(upstream.value, errors.FenceError)
        assert upstream.value.response.status_code == 409
        answered = await lease.request(
            "PUT", RULE_PATH, json={"route_to": "x"}, headers=conflict, raise_for_status=False
        )
        assert answered.status_code == 409
        with pytest.raises(errors.UpstreamError) as unavailable:
            await lease.request("GET", RULE_PATH, headers={"Demo-Status": "503"})
        assert unavailable.value.status == 503
        with pytest.raises(errors.NoRoute):
            await lease.request("DELETE", "/nowhere")
        with pytest.raises(errors.MissingIdempotencyKey):
            await lease.request("POST", f"/orders/{SKU}", json={"qty": 1})
    assert stack.upstream_rule_history(RULE) == []


async def test_the_token_is_in_no_repr_exception_or_log_line(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    async with (
        AsyncFenceClient(stack.proxy_url) as client,
        await client.acquire(ORDER_RESOURCE, "worker-a", ttl_s=1.0, renew=True) as lease,
    ):
        seen += [repr(lease), str(lease), repr(client)]
        with pytest.raises(errors.OutcomeUnknown) as unknown:
            await lease.request(
                "POST", f"/orders/{SKU}", json={}, idempotency_key="k", headers=DROP_RESPONSE
            )
        assert stack.revoke(ORDER_RESOURCE, "test").status == 200
        await eventually("the lease to be known lost", lambda: lease.lost)
        with pytest.raises(errors.StaleEpoch) as stale:
            await lease.request("POST", f"/orders/{SKU}", json={}, idempotency_key="k2")
        async with AsyncFenceClient("http://127.0.0.1:1") as nowhere:
            with pytest.raises(httpx.ConnectError) as unreachable:
                await nowhere.acquire(ORDER_RESOURCE, "w")
        for error in (unknown.value, stale.value, unreachable.value):
            seen += [str(error), repr(error), repr(getattr(error, "problem", None))]
    assert "lost" in caplog.text  # the renewer did log the loss
    seen.append(caplog.text)
    for text in seen:
        assert lease.token not in text
