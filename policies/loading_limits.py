"""A policy file's bounds: lease TTLs (`leases`), what one connection or request may
take (`limits`), and per-client quotas (`quotas`)."""

from __future__ import annotations

from policies.model import (
    LeaseBounds,
    Limits,
    Quotas,
)
from policies.nodes import Mapping, Problems


def parse_leases(root: Mapping, problems: Problems) -> LeaseBounds:
    node = root.child("leases")
    if node is None:
        return LeaseBounds(1, 300, 30)
    leases = Mapping(node, problems, {"min_ttl_s", "max_ttl_s", "default_ttl_s"})
    low = leases.number("min_ttl_s", default=1, minimum=0.001)
    high = leases.number("max_ttl_s", default=300, minimum=0.001)
    default = leases.number("default_ttl_s", default=30, minimum=0.001)
    if None in (low, high, default):
        return LeaseBounds(1, 300, 30)
    if low > high:
        problems.add(node, f"min_ttl_s ({low}) is above max_ttl_s ({high})")
    elif not low <= default <= high:
        problems.add(node, f"default_ttl_s ({default}) is outside [{low}, {high}]")
    return LeaseBounds(float(low), float(high), float(default))


def parse_limits(root: Mapping, problems: Problems) -> Limits:
    """`limits: {header_timeout_s, body_timeout_s, max_requests, max_connections,
    max_unverified_waits}`."""
    default = Limits()
    node = root.child("limits")
    if node is None:
        return default
    block = Mapping(
        node,
        problems,
        {
            "header_timeout_s",
            "body_timeout_s",
            "max_requests",
            "max_connections",
            "max_unverified_waits",
        },
    )
    if not block.valid:
        return default
    header = block.number("header_timeout_s", default=default.header_timeout_s, minimum=0.001)
    body = block.number("body_timeout_s", default=default.body_timeout_s, minimum=0.001)
    most = block.number("max_requests", default=default.max_requests, minimum=1, integer=True)
    connections = block.number(
        "max_connections", default=default.max_connections, minimum=1, integer=True
    )
    most = most if isinstance(most, int) else default.max_requests
    unverified = block.number("max_unverified_waits", default=None, minimum=1, integer=True)
    if isinstance(unverified, int) and unverified >= most:
        problems.add(
            block.children["max_unverified_waits"],
            f"must be below max_requests ({most}): requests without a credential "
            "could otherwise take every one a worker with a credential needs",
        )
        unverified = None
    return Limits(
        float(header) if header is not None else default.header_timeout_s,
        float(body) if body is not None else default.body_timeout_s,
        most,
        connections if isinstance(connections, int) else default.max_connections,
        unverified if isinstance(unverified, int) else None,
    )


def parse_quotas(root: Mapping, problems: Problems) -> Quotas:
    """`quotas: {live_leases, acquires_per_s, burst}`; 0 is unlimited."""
    default = Quotas()
    node = root.child("quotas")
    if node is None:
        return default
    block = Mapping(node, problems, {"live_leases", "acquires_per_s", "burst"})
    if not block.valid:
        return default
    live = _limit(block, "live_leases", default.live_leases, integer=True)
    rate = _limit(block, "acquires_per_s", default.acquires_per_s, integer=False)
    burst = _limit(block, "burst", default.burst, integer=True)
    if burst == 0:
        problems.add(
            block.children["burst"],
            "must be at least 1 (no acquire could pass); acquires_per_s: 0 lifts the rate limit",
        )
        burst = default.burst
    return Quotas(int(live), float(rate), int(burst))


def _limit(block: Mapping, name: str, default: float, integer: bool) -> float:
    """A quota's value (0: unlimited), or its default after a problem. null is refused
    rather than read as unlimited: a key left empty by mistake must not lift a limit."""
    child = block.child(name)
    if child is not None and child.scalar() is None:
        block.problems.add(child, "null is not a limit: give a number, or 0 for unlimited")
        return default
    value = block.number(name, default=default, integer=integer)
    return default if value is None else float(value)
