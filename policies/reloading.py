"""What a running proxy may take from a policy file read again (`fenceproxy reload`,
SIGHUP), and what it must refuse. No I/O: the proxy's shell reads the file, the
effects in doubt and swaps the policy (proxy/reloading.py).

Routes, upstreams, leases, quotas and the clients of `auth:` change while it runs:
each request takes the policy and the credentials made from its clients once, at its
start, and keeps them to its end. `auth:` itself may be added by a reload, never
taken away (`auth_taken_away`). The other blocks are read once at start by things
that outlive a request (the listener and its TLS files, the connection limits given
to the server, the store and its pool, the admin tokens, the retention collector),
so a change of theirs needs a restart, and is refused rather than half applied.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from policies.model import Policy

# The policy's keys (as the file spells them) that only a restart can change.
RESTART_KEYS = (
    "listen",
    "metrics_listen",
    "store",
    "store_pool",
    "admin_token_env",
    "admin_token_next_env",
    "limits",
    "retention",
)


def restart_changes(old: Policy, new: Policy) -> list[str]:
    """The keys whose value differs and that a running proxy cannot take."""
    return [key for key in RESTART_KEYS if getattr(old, key) != getattr(new, key)]


def auth_taken_away(old: Policy, new: Policy) -> str | None:
    """Why a reload may not serve `new` after `old` for want of `auth:`, or None. A file
    that lost its `auth:` block, by mistake or not, would open the lease API and every
    read to anyone who can reach the proxy, from the next request on and with no one
    restarting anything: serving without it takes a restart, a deliberate act."""
    if old.auth is None or new.auth is not None:
        return None
    return (
        "auth cannot be taken away by a reload (every call would then need no key); "
        "restart the proxy to serve without it"
    )


def stranding_changes(old: Policy, new: Policy) -> dict[str, str]:
    """Old fenced routes that the new policy takes away, by name, with what it takes:
    an effect in doubt on one would have no route, or no probe, to settle it."""
    routes = {route.name: route for route in new.routes}
    taken: dict[str, str] = {}
    for route in old.routes:
        if not route.fenced:
            continue  # a pass-through route records no effect
        after = routes.get(route.name)
        if after is None or not after.fenced:
            taken[route.name] = "removed" if after is None else "no longer fenced"
        elif route.reconcile is not None and after.reconcile is None:
            taken[route.name] = "its reconcile: probe dropped"
    return taken


@dataclass(frozen=True)
class Unsettled:
    """An effect in doubt (core/lifecycle.py BLOCKING), as the refusal names it."""

    effect_id: str
    route: str
    resource: str
    state: str


def stranded(taken: dict[str, str], unsettled: Iterable[Unsettled]) -> list[str]:
    """One phrase per effect in doubt that the change would strand; empty: none."""
    return [
        f"{effect.effect_id} ({effect.state}, resource {effect.resource}) on route "
        f"{effect.route} ({taken[effect.route]})"
        for effect in unsettled
        if effect.route in taken
    ]
