"""Lease sizing, measured: a worker writing through a lease shorter than the route's
upstream timeout plus the renewal period.

    python -m bench.lease_sizing [--writes 37] [--ttl 2.5] [--timeout 2]

Starts the demo upstream and `fenceproxy serve` (a `put-rule` route with the given
upstream timeout) on free ports, writes `--writes` rules in a loop under one lease
renewed in the background (`renew=True`, every third of the ttl), each write held
100 ms by the upstream, and prints how many writes the worker saw refused
(`LeaseTooShort` raised to it), how many the proxy refused (its rejection log: with
the sizing client, the refusals it answered by renewing and sending once more), and
how many reached the upstream.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from pathlib import Path

from fenceproxy_client import FenceClient, errors

from tests.integration.processes.conftest import StackOptions, _start_stack

WRITE_DELAY = {"Demo-Delay-Ms": "100"}


def measure(writes: int, ttl_s: float, timeout_s: float) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as folder:
        options = StackOptions(upstream_timeout_s=timeout_s)
        with contextlib.contextmanager(_start_stack)(Path(folder), options) as stack:
            raised = 0
            with (
                FenceClient(stack.proxy_url, timeout_s=timeout_s + 3) as client,
                client.lease("rule:r1", "worker-a", ttl_s=ttl_s, renew=True) as lease,
            ):
                for write in range(writes):
                    try:
                        lease.request("PUT", "/rules/r1", json={"n": write}, headers=WRITE_DELAY)
                    except errors.LeaseTooShort:
                        raised += 1
            proxy_refused = sum(
                r["count"] for r in stack.rejections("rule:r1") if r["code"] == "lease_too_short"
            )
            return {
                "writes": writes,
                "raised_to_worker": raised,
                "refused_by_proxy": proxy_refused,
                "reached_upstream": len(stack.upstream_rule_history("r1")),
            }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.lease_sizing")
    parser.add_argument("--writes", type=int, default=37)
    parser.add_argument("--ttl", type=float, default=2.5)
    parser.add_argument("--timeout", type=float, default=2.0)
    args = parser.parse_args()
    print(json.dumps(measure(args.writes, args.ttl, args.timeout)))


if __name__ == "__main__":
    main()
