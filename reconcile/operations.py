"""Reconciliation as operations on parsed values: the sweep, recovery after a restart,
what is in doubt, a probe now, an operator's decision.

The admin API (`proxy/control.py`) and the CLI (`proxy/cli_store.py`) reach these by
one path: `proxy/operations.py` checks what the operator sent, then calls these
(`in_doubt` takes nothing to check, and both call it directly). A refusal is
returned as a `Refusal`, as the store returns its own, and raised there for both
faces to present.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

from core.codes import ErrorCode
from core.lifecycle import AWAITING_RECONCILIATION, BLOCKING, DEADLINE_MARGIN_S, probe_refusal
from core.records import EffectEvent, EffectRecord, EffectState, Refusal
from policies import Policy
from reconcile.prober import ProbeResult, probe_effect
from store import Store


async def sweep(store: Store) -> None:
    """Effects past their deadline can be in flight nowhere: mark them UNKNOWN first, so
    that what follows sees them as they are, whether or not a proxy (whose background
    sweep does the same every second) is running."""
    await store.recover(None, DEADLINE_MARGIN_S)


async def recover_after_restart(store: Store) -> list[str]:
    """Whatever this instance had in flight when it last stopped has an unknown fate now,
    and its resources must stay blocked: its effects become UNKNOWN (returned), before
    the listener opens."""
    return await store.recover(store.instance_id, DEADLINE_MARGIN_S)


def no_effect(effect_id: str) -> Refusal:
    return Refusal(ErrorCode.NOT_FOUND, f"no effect {effect_id}", {"effect_id": effect_id})


@dataclass(frozen=True)
class InDoubtEffect:
    effect: EffectRecord
    age_s: float
    last_event: EffectEvent | None
    # Whether its route has a probe (a reconcile block) in the answering proxy's
    # policy: without one only an operator settles it, and "Probe now" cannot help.
    has_probe: bool

    def as_json(self) -> dict[str, Any]:
        return {
            **self.effect.as_json(),
            "age_s": round(self.age_s, 3),
            "last_event": self.last_event.as_json() if self.last_event else None,
            "has_probe": self.has_probe,
        }


@dataclass(frozen=True)
class InDoubt:
    """What waits for reconciliation: the blocked resources and the effects in doubt."""

    blocked_resources: tuple[str, ...]
    effects: tuple[InDoubtEffect, ...]  # oldest first

    def as_json(self) -> dict[str, Any]:
        return {
            "blocked_resources": list(self.blocked_resources),
            "in_doubt": [entry.as_json() for entry in self.effects],
        }


async def unsettled(store: Store, limit: int) -> list[EffectRecord]:
    """The effects in doubt, as listed (no sweep, no history): what a policy reload
    checks before it takes a route or a probe away (proxy/reloading.py)."""
    return await store.in_doubt(limit)


def _has_probe(policy: Policy, route_name: str) -> bool:
    route = policy.route_named(route_name)
    return route is not None and route.reconcile is not None


async def in_doubt(store: Store, policy: Policy) -> InDoubt:
    await sweep(store)
    found: list[tuple[EffectRecord, EffectEvent | None]] = []
    for listed in await store.in_doubt():
        # Read again with its history as of one moment: it may have been settled since
        # the listing, and then it is no longer in doubt.
        effect, events = await store.effect_with_events(listed.id)
        if effect is not None and effect.state in BLOCKING:
            found.append((effect, events[-1] if events else None))
    # Ages on the authority's clock, as every time the store records.
    now = await store.now()
    return InDoubt(
        blocked_resources=tuple(
            sorted({e.resource for e, _ in found if e.state in AWAITING_RECONCILIATION})
        ),
        effects=tuple(
            InDoubtEffect(e, now - e.created_at, last, _has_probe(policy, e.route))
            for e, last in found
        ),
    )


async def probe(
    store: Store,
    session: aiohttp.ClientSession,
    policy: Policy,
    effect_id: str,
    actor: str | None = None,
    note: str | None = None,
) -> ProbeResult | Refusal:
    """Ask the upstream now, whatever the probe schedule says, and record the answer
    with `actor` (the admin API's client; None: this process) as who asked, and the
    operator's `note`, if given, after the answer's detail."""
    await sweep(store)
    effect = await store.effect(effect_id)
    if effect is None:
        return no_effect(effect_id)
    refused = probe_refusal(effect.id, effect.state)
    if refused is not None:
        return refused
    route = policy.route_named(effect.route)
    if route is None or route.reconcile is None:
        # The schedule records that no probe exists and leaves the effect to an operator;
        # asked by hand, it is refused outright, and no attempt is counted.
        return Refusal(
            ErrorCode.NO_PROBE,
            f"the route {effect.route!r} has no reconcile block, so there is nothing to ask; "
            "an operator settles the effect with `reconcile resolve`",
            {"effect_id": effect.id, "route": effect.route},
        )
    return await probe_effect(store, session, policy, effect, actor, note)


async def resolve(
    store: Store, effect_id: str, settled_as: EffectState, reason: str, operator: str
) -> EffectRecord | Refusal:
    """Record an operator's decision; the store refuses an effect that is not resolvable
    (core.lifecycle.RESOLVABLE) or still in flight."""
    await sweep(store)
    return await store.resolve(effect_id, settled_as, reason, operator)
