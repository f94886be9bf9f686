"""Work inside the lease is told when the lease is lost, against the
real proxy and demo upstream: an operator revokes the lease (or it runs out) while the
work goes on. Async: the `cancel_on_lost` block is cancelled and the `async with`
raises LeaseLost; sync: `lease.check()` raises LeaseLost between steps.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from fenceproxy_client import AsyncFenceClient, FenceClient, errors

from tests.client.test_async_client import eventually
from tests.integration.processes.conftest import Stack, wait_until

RESOURCE = "rule:r1"
WAIT_S = 10.0


async def test_a_revoked_lease_cancels_the_block_and_raises_lease_lost(stack: Stack) -> None:
    reached_the_end = False
    async with AsyncFenceClient(stack.proxy_url, timeout_s=5.0) as client:
        started = time.monotonic()
        with pytest.raises(errors.LeaseLost) as lost:
            async with client.lease(
                RESOURCE, "worker-a", ttl_s=1.5, renew=True, cancel_on_lost=True
            ) as lease:
                assert stack.revoke(RESOURCE, "host drained").status == 200
                await asyncio.sleep(WAIT_S)  # long work, cut short by the renewer's refusal
                reached_the_end = True
        assert not reached_the_end
        assert time.monotonic() - started < WAIT_S / 2
        assert (lost.value.resource, lost.value.epoch) == (RESOURCE, lease.epoch)
        assert "stale_epoch" in lost.value.why
        # The scope withdrew its own cancellation: the task goes on awaiting normally.
        current = asyncio.current_task()
        assert current is not None and current.cancelling() == 0
        await asyncio.sleep(0)


async def test_a_lease_left_to_expire_cancels_the_block_without_renewal(stack: Stack) -> None:
    async with AsyncFenceClient(stack.proxy_url, timeout_s=5.0) as client:
        with pytest.raises(errors.LeaseLost, match="expired without a renewal"):
            async with client.lease(RESOURCE, "worker-a", ttl_s=0.6, cancel_on_lost=True):
                await asyncio.sleep(WAIT_S)


async def test_the_callers_own_cancellation_is_not_turned_into_lease_lost(stack: Stack) -> None:
    async with AsyncFenceClient(stack.proxy_url, timeout_s=5.0) as client:
        inside = asyncio.Event()

        async def work() -> None:
            async with client.lease(RESOURCE, "worker-a", ttl_s=10, cancel_on_lost=True):
                inside.set()
                await asyncio.sleep(WAIT_S)

        task = asyncio.create_task(work())
        # Inside the block, not during the grant: a grant the client never read would
        # hold the lease with nobody to release it.
        await asyncio.wait_for(inside.wait(), WAIT_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert stack.lease(RESOURCE)["live"] is False


async def test_without_cancel_on_lost_the_block_runs_on(stack: Stack) -> None:
    async with (
        AsyncFenceClient(stack.proxy_url, timeout_s=5.0) as client,
        client.lease(RESOURCE, "worker-a", ttl_s=1.5, renew=True) as lease,
    ):
        assert stack.revoke(RESOURCE, "host drained").status == 200
        await eventually("the lease to be known lost", lambda: lease.lost)
        with pytest.raises(errors.LeaseLost, match="stale_epoch"):
            lease.check()


def test_check_raises_lease_lost_once_the_lease_is_known_gone(stack: Stack) -> None:
    with FenceClient(stack.proxy_url, timeout_s=5.0) as client:
        with client.lease(RESOURCE, "worker-a", ttl_s=1.5, renew=True) as lease:
            lease.check()  # held: nothing raised
            assert stack.revoke(RESOURCE, "host drained").status == 200
            wait_until("the lease to be known lost", lambda: lease.lost, WAIT_S)
            with pytest.raises(errors.LeaseLost, match="stale_epoch") as lost:
                lease.check()
            assert lost.value.epoch == lease.epoch
        unrenewed = client.acquire("rule:r2", "worker-a", ttl_s=0.6)
        unrenewed.check()
        wait_until("the ttl to run out", lambda: unrenewed.lost, WAIT_S)
        with pytest.raises(errors.LeaseLost, match="expired without a renewal"):
            unrenewed.check()
