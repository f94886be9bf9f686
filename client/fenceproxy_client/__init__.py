"""A worker's client for fenceproxy: leases, fenced requests and typed refusals.

    from fenceproxy_client import FenceClient, errors

    with FenceClient("http://127.0.0.1:8080") as client:
        with client.lease("rule:r1", "worker-a", ttl_s=10, wait_s=5.0, renew=True) as lease:
            lease.request("PUT", "/rules/r1", json={"route_to": "eu-west"})

The proxy decides: the client never refuses a request on its own clock and never
sends a write twice. See README.md.
"""

from fenceproxy_client import errors
from fenceproxy_client._async import AsyncFenceClient, AsyncLease, AsyncLeaseScope
from fenceproxy_client._common import EffectStatus, new_key
from fenceproxy_client._sync import FenceClient, Lease, LeaseScope

__all__ = [
    "AsyncFenceClient",
    "AsyncLease",
    "AsyncLeaseScope",
    "EffectStatus",
    "FenceClient",
    "Lease",
    "LeaseScope",
    "errors",
    "new_key",
]
