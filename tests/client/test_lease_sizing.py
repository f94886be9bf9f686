"""The client keeps its lease long enough for the write, against the
real proxy and demo upstream: a route whose upstream timeout is 2 s, a lease of 2.5 s
renewed in the background (every third of its ttl, so only 2/3 of it, 1.67 s, is sure
to be left), and a worker writing in a loop.

The proxy's `lease_too_short` says what the route needs (`needed_s`); the client
renews and sends once more (nothing was sent upstream), and from then on renews before
a write when less than that is left. Judged by the proxy's own rejection log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fenceproxy_client import AsyncFenceClient, FenceClient, errors

from tests.integration.processes.conftest import Stack, StackOptions, _start_stack

UPSTREAM_TIMEOUT_S = 2.0
LEASE_TTL_S = 2.5
WRITES = 37  # the case: 14 of 37 refused before
# Each write takes this long at the upstream, so the loop outlives several renewals.
WRITE_DELAY = {"Demo-Delay-Ms": "100"}


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    yield from _start_stack(tmp_path, StackOptions(upstream_timeout_s=UPSTREAM_TIMEOUT_S))


def refused_too_short(stack: Stack, resource: str) -> int:
    return sum(r["count"] for r in stack.rejections(resource) if r["code"] == "lease_too_short")


def test_a_renewed_lease_shorter_than_timeout_plus_renewal_period_writes_every_time(
    stack: Stack,
) -> None:
    with (
        FenceClient(stack.proxy_url, timeout_s=5.0) as client,
        client.lease("rule:r1", "worker-a", ttl_s=LEASE_TTL_S, renew=True) as lease,
    ):
        for write in range(WRITES):
            lease.request("PUT", "/rules/r1", json={"n": write}, headers=WRITE_DELAY)
    assert len(stack.upstream_rule_history("r1")) == WRITES
    # Refused once, when the proxy told the client what the route needs; never again.
    assert refused_too_short(stack, "rule:r1") <= 1


async def test_the_async_client_sizes_its_lease_the_same_way(stack: Stack) -> None:
    async with (
        AsyncFenceClient(stack.proxy_url, timeout_s=5.0) as client,
        client.lease("rule:r2", "worker-a", ttl_s=LEASE_TTL_S) as lease,
    ):
        # Not renewed in the background at all: each write renews when it must.
        for write in range(12):
            await lease.request("PUT", "/rules/r2", json={"n": write}, headers=WRITE_DELAY)
    assert len(stack.upstream_rule_history("r2")) == 12
    assert refused_too_short(stack, "rule:r2") <= 1


def test_a_ttl_below_what_the_route_needs_is_raised_at_once_with_the_need(stack: Stack) -> None:
    with (
        FenceClient(stack.proxy_url, timeout_s=5.0) as client,
        client.lease("rule:r3", "worker-a", ttl_s=1.5) as lease,
        pytest.raises(errors.LeaseTooShort) as refused,
    ):
        lease.request("PUT", "/rules/r3", json={})
    assert refused.value.problem["needed_s"] == UPSTREAM_TIMEOUT_S
    assert 0 < refused.value.problem["remaining_s"] <= 1.5
    # Renewing to 1.5 s cannot help, so nothing was renewed or sent again.
    assert refused_too_short(stack, "rule:r3") == 1
    assert stack.upstream_rule_history("r3") == []
