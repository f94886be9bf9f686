"""Quotas on acquires: whose quota an acquire counts against, and
the acquire rate. The live-lease cap is decided in the acquire's own transaction
(core/fencing.py `decide_acquire`); the rate is checked here first, in memory, so a
flood of acquires over it costs the store nothing.

Renew and release are never rate limited: a worker must always be able to give a
lease back or keep the one it holds, and neither adds a lease. A runaway renew loop
costs one small update each, on a lease its token already proves it holds.
"""

from __future__ import annotations

from aiohttp import web

from core.codes import ErrorCode
from core.quotas import retry_after_s
from core.records import Refusal
from proxy.auth import CLIENT
from proxy.runtime import Runtime


def quota_subject(request: web.Request, holder: str) -> str:
    """Whose quotas an acquire counts against: with `auth:`, the authenticated client
    (the store then counts the live leases that client took, `live_leases_of_client`);
    without it, the holder the request names. That is all an unauthenticated request
    says about who sent it, and anyone may name any holder, so then the quotas stop
    careless workers, not hostile ones."""
    client = request.get(CLIENT)
    return client.name if client is not None else holder


def over_acquire_rate(runtime: Runtime, subject: str, resource: str) -> Refusal | None:
    """Take one acquire from `subject`'s bucket; the refusal if it has none left."""
    quotas = runtime.policy.quotas
    wait_s = runtime.acquire_rate.take(
        subject, quotas.acquires_per_s, quotas.burst, runtime.quota_clock()
    )
    if wait_s == 0:
        return None
    return Refusal(
        ErrorCode.RATE_LIMITED,
        f"{subject} is acquiring faster than quotas.acquires_per_s allows "
        f"({quotas.acquires_per_s:g} a second after a burst of {quotas.burst})",
        {"resource": resource, "retry_after_s": retry_after_s(wait_s)},
    )
