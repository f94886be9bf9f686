"""Lease sizing from the measured tail: the advice, as pure functions.

A *turn* is the time from a grant to its holder's release: how long the work really
took. This module groups the recorded lease lives (per route template, else per
resource prefix), and turns each group's measured turns (core/lease_turns.py, the
math) into advice: a suggested TTL, the false-expiry curve, the checks of each
route's timeout. Everything here is exact and pinned by
tests/unit/test_leasing_advice.py; nothing performs I/O or reads a clock.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from fnmatch import fnmatchcase
from typing import Any

from core.lease_turns import (
    TurnStats,
    detection_delay,
    nearest_rank,
    rounded,
    share_outliving,
    suggested_ttl,
    ttl_floor,
    turn_stats,
)

# The advice warns when it rests on fewer turns than this.
FEW_TURNS = 20
DEFAULT_TARGETS = (0.5, 0.1, 0.05, 0.0)
DEFAULT_MARGIN = 2.0
DEFAULT_POLL_INTERVAL_S = 1.0


class Ending:
    """How a lease ended (None while it is live)."""

    RELEASED = "released"  # by its holder: grant to release is a turn
    REVOKED = "revoked"  # by an operator (or `store fence-restore`)
    SUPERSEDED = "superseded"  # expired, and another holder took the resource over
    EXPIRED = "expired"  # expired, and nobody has ended it since


@dataclass(frozen=True)
class LeaseLife:
    """One lease as the store recorded it (store/leases.py `lease_lives`)."""

    resource: str
    epoch: int
    granted_at: float
    expires_at: float
    ended_at: float | None
    end_reason: str | None
    granted_ttl_s: float | None  # None: granted before this was recorded
    renewals: int
    came_back_at: float | None  # when its holder showed it was alive after expiry

    def ending(self, now: float) -> str | None:
        if self.ended_at is None:
            return Ending.EXPIRED if self.expires_at <= now else None
        if self.end_reason == Ending.RELEASED:
            return Ending.RELEASED
        if self.end_reason == Ending.SUPERSEDED:
            return Ending.SUPERSEDED
        return Ending.REVOKED

    def turn_s(self) -> float | None:
        """Grant to release: the time the work took (only a released lease says)."""
        if self.end_reason != Ending.RELEASED or self.ended_at is None:
            return None
        return max(0.0, self.ended_at - self.granted_at)

    def expired(self, now: float) -> bool:
        """Its lease ran out before anyone ended it (a release after expiry included)."""
        return self.expires_at <= (self.ended_at if self.ended_at is not None else now)


@dataclass(frozen=True)
class RouteSpec:
    """A fenced route as the advice needs it: its resource template as a glob."""

    name: str
    resource_glob: str
    timeout_s: float


@dataclass(frozen=True)
class AdviceRequest:
    """What was asked: every field already validated (proxy/operations.py)."""

    resource: str | None  # a glob; None: one group per route template and prefix
    since_s: float | None
    margin: float = DEFAULT_MARGIN
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    targets: tuple[float, ...] = DEFAULT_TARGETS
    leases: tuple[float, ...] | None = None  # the curve's grid; None: default_grid
    min_ttl_s: float = 0.0  # the policy's bounds: a suggestion is never below min
    max_ttl_s: float = math.inf
    default_ttl_s: float | None = None


# Groups of resources no route template covers, by prefix: past this many (the busiest
# kept), the rest share one "*" group, so that made-up names cannot grow the output.
MAX_PREFIX_GROUPS = 50

OTHER_GROUP = "*"


def template_glob(template: str) -> str:
    """`rule:{rule_id}` → `rule:*`: the resources a route template renders."""
    glob, depth = [], 0
    for char in template:
        if char == "{":
            if depth == 0:
                glob.append("*")
            depth += 1
        elif char == "}" and depth:
            depth -= 1
        elif depth == 0:
            glob.append(char)
    return "".join(glob)


def prefix_group(resource: str) -> str:
    """`job:42` → `job:*`; a name without ':' belongs to the catch-all group."""
    head, colon, _ = resource.partition(":")
    return f"{head}:*" if colon else OTHER_GROUP


def group_of(resource: str, route_globs: Sequence[str]) -> str:
    """The first route template that renders `resource`, else its prefix."""
    for glob in route_globs:
        if fnmatchcase(resource, glob):
            return glob
    return prefix_group(resource)


def routes_of_group(group: str, routes: Sequence[RouteSpec]) -> list[RouteSpec]:
    """The fenced routes whose writes a group's holders may send: the route's glob
    matches the group's text (`rule:r1`, `rule:*`) or the group's matches the route's
    (`*`, `rule:*`)."""
    return [
        route
        for route in routes
        if fnmatchcase(group, route.resource_glob) or fnmatchcase(route.resource_glob, group)
    ]


def target_key(target: float) -> str:
    """A target rate as the JSON key spells it: 0.5, 0.05, 0."""
    return f"{target:g}"


def _seconds(value: float | None) -> float | None:
    return None if value is None else rounded(value)


def _percent(share: float) -> str:
    return f"{share * 100:.3g}%"


@dataclass(frozen=True)
class GroupAdvice:
    resource: str
    stats: TurnStats
    turns_s: tuple[float, ...]  # sorted ascending
    suggested_ttl_s: float | None
    detection_delay_s: float | None
    typical_turn_s: float | None
    poll_interval_s: float
    expired: int
    came_back: int
    ttls_in_use: tuple[float, ...]  # sorted ascending
    warnings: tuple[str, ...]
    # Its leases that are no longer live, by how they ended (LeaseLife.ending): what the
    # status page's Leases panel lists too, so the two agree on whether any ended.
    ended: tuple[tuple[str, int], ...] = ()

    @property
    def ended_total(self) -> int:
        return sum(count for _, count in self.ended)

    def false_expiries_at(self, lease_s: float) -> int:
        """How many measured turns a lease of `lease_s` would have cut short."""
        return sum(1 for t in self.turns_s if t > lease_s)

    def as_json(self) -> dict[str, Any]:
        stats = self.stats
        turn_s = None
        if stats.percentiles is not None:
            turn_s = {f"p{p}": rounded(v) for p, v in stats.percentiles.items()}
            turn_s["max"] = rounded(stats.longest or 0.0)
        shortest = None
        if stats.turns:
            shortest = {target_key(t): _seconds(v) for t, v in stats.shortest_lease.items()}
        ttls = None
        if self.ttls_in_use:
            ttls = {
                "p50": nearest_rank(self.ttls_in_use, 50),
                "min": self.ttls_in_use[0],
            }
        delay = None
        if self.detection_delay_s is not None:
            delay = {
                "lease_s": _seconds(self.suggested_ttl_s),
                "turn_s": _seconds(self.typical_turn_s),
                "poll_interval_s": self.poll_interval_s,
                "expected": self.detection_delay_s,
            }
        return {
            "resource": self.resource,
            "turns": stats.turns,
            "turn_s": turn_s,
            "shortest_lease_s": shortest,
            "false_expiry_curve": [
                {"lease_s": lease, "share": share} for lease, share in stats.curve
            ],
            "suggested_ttl_s": _seconds(self.suggested_ttl_s),
            "detection_delay_s": delay,
            "expired": {
                "total": self.expired,
                "holder_came_back": self.came_back,
                "never_came_back": self.expired - self.came_back,
            },
            "ttls_in_use_s": ttls,
            "ended": {"total": self.ended_total, **dict(self.ended)},
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class RouteAdvice:
    name: str
    latencies: tuple[float, ...]  # sorted ascending
    timeout_s: float

    def tail(self) -> dict[str, float] | None:
        if not self.latencies:
            return None
        return {
            "p50": rounded(nearest_rank(self.latencies, 50) or 0.0),
            "p99": rounded(nearest_rank(self.latencies, 99) or 0.0),
            "max": rounded(self.latencies[-1]),
        }

    def warnings(self) -> list[str]:
        p99 = nearest_rank(self.latencies, 99)
        if p99 is None or p99 < self.timeout_s:
            return []
        return [
            f"route {self.name}: the upstream timeout {self.timeout_s:g} s sits inside the "
            f"measured tail (p99 {rounded(p99):g} s): slow answers are cut off and their "
            "outcome becomes unknown"
        ]

    def as_json(self) -> dict[str, Any]:
        return {
            "route": self.name,
            "requests": len(self.latencies),
            "upstream_s": self.tail(),
            "timeout_s": self.timeout_s,
            "warnings": self.warnings(),
        }


@dataclass(frozen=True)
class Advice:
    groups: tuple[GroupAdvice, ...]
    routes: tuple[RouteAdvice, ...]
    # What no TTL can fix: the policy itself refuses every write of a route.
    problems: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "groups": [group.as_json() for group in self.groups],
            # Leases no longer live, in every group: zero is the one case where "no
            # lease ended" is true. Ended leases with no measured turn (expired,
            # revoked, superseded: only a release measures one) are not zero.
            "leases_ended": sum(group.ended_total for group in self.groups),
            "routes": [route.as_json() for route in self.routes],
            "problems": list(self.problems),
        }


def advise(
    lives: Iterable[LeaseLife],
    latencies: Iterable[tuple[str, float]],
    routes: Sequence[RouteSpec],
    request: AdviceRequest,
    now: float,
) -> Advice:
    """The advice from recorded leases (already limited to `since`) and upstream
    latencies (route, seconds) of the fenced routes `routes`."""
    by_group: dict[str, list[LeaseLife]] = {}
    if request.resource is not None:
        by_group[request.resource] = [
            life for life in lives if fnmatchcase(life.resource, request.resource)
        ]
    else:
        globs = [route.resource_glob for route in routes]
        for glob in dict.fromkeys(globs):
            by_group[glob] = []
        for life in lives:
            by_group.setdefault(group_of(life.resource, globs), []).append(life)
        by_group = _bounded(by_group, set(globs))
    groups = tuple(
        _group_advice(name, members, routes_of_group(name, routes), request, now)
        for name, members in by_group.items()
    )
    measured: dict[str, list[float]] = {route.name: [] for route in routes}
    for route, seconds in latencies:
        if route in measured:
            measured[route].append(seconds)
    return Advice(
        groups,
        tuple(
            RouteAdvice(route.name, tuple(sorted(measured[route.name])), route.timeout_s)
            for route in routes
        ),
        tuple(
            f"route {route.name}: leases.max_ttl_s {request.max_ttl_s:g} is below its "
            f"upstream timeout {route.timeout_s:g} s: every write is refused (lease_too_short)"
            for route in routes
            if route.timeout_s > request.max_ttl_s
        ),
    )


def _bounded(by_group: dict[str, list[LeaseLife]], kept: set[str]) -> dict[str, list[LeaseLife]]:
    prefixes = sorted(
        (name for name in by_group if name not in kept and name != OTHER_GROUP),
        key=lambda name: (-len(by_group[name]), name),
    )
    if len(prefixes) <= MAX_PREFIX_GROUPS:
        return by_group
    folded = by_group.pop(OTHER_GROUP, [])
    for name in prefixes[MAX_PREFIX_GROUPS:]:
        folded.extend(by_group.pop(name))
    by_group[OTHER_GROUP] = folded
    return by_group


def _group_advice(
    name: str,
    lives: Sequence[LeaseLife],
    routes: Sequence[RouteSpec],
    request: AdviceRequest,
    now: float,
) -> GroupAdvice:
    turns = sorted(t for life in lives if (t := life.turn_s()) is not None)
    stats = turn_stats(turns, request.targets, request.leases)
    floor = ttl_floor(stats.longest, (route.timeout_s for route in routes))
    suggested: float | None = None
    if stats.longest is not None or floor > 0:
        suggested = max(suggested_ttl(stats.longest, request.margin, floor), request.min_ttl_s)
    typical = stats.percentiles[50] if stats.percentiles else None
    delay = None
    if suggested is not None and typical is not None:
        delay = detection_delay(rounded(suggested), rounded(typical), request.poll_interval_s)
    expired = [life for life in lives if life.expired(now)]
    came_back = sum(1 for life in expired if life.came_back_at is not None)
    ttls = tuple(sorted(life.granted_ttl_s for life in lives if life.granted_ttl_s is not None))
    warnings = _warnings(stats, turns, routes, request, suggested, floor, ttls, came_back)
    endings = Counter(ending for life in lives if (ending := life.ending(now)) is not None)
    return GroupAdvice(
        resource=name,
        stats=stats,
        turns_s=tuple(turns),
        suggested_ttl_s=suggested,
        detection_delay_s=delay,
        typical_turn_s=typical,
        poll_interval_s=request.poll_interval_s,
        expired=len(expired),
        came_back=came_back,
        ttls_in_use=ttls,
        warnings=tuple(warnings),
        ended=tuple(sorted(endings.items())),
    )


def _warnings(
    stats: TurnStats,
    turns: Sequence[float],
    routes: Sequence[RouteSpec],
    request: AdviceRequest,
    suggested: float | None,
    floor: float,
    ttls: Sequence[float],
    came_back: int,
) -> list[str]:
    found = []
    if stats.turns < FEW_TURNS:
        found.append(
            f"the advice rests on {stats.turns} measured turn(s), fewer than {FEW_TURNS}: "
            "measure more before trusting it"
        )
    if ttls and turns:
        outliving = share_outliving(turns, ttls[0])
        if outliving > 0:
            found.append(
                f"holders request {ttls[0]:g} s but {_percent(outliving)} of turns take "
                f"longer than that ({sum(1 for t in turns if t > ttls[0])} of {len(turns)}): "
                "those leases expire under live workers unless they renew"
            )
    if came_back:
        found.append(
            f"{came_back} lease(s) expired while their holder was still working "
            "(measured false expiries)"
        )
    if suggested is not None and stats.longest is not None:
        measured = suggested_ttl(stats.longest, request.margin, 0.0)
        if floor > measured:
            slowest = max(routes, key=lambda route: route.timeout_s)
            found.append(
                f"raised to {rounded(floor):g} s: a write at the end of the longest turn "
                f"must still find route {slowest.name}'s upstream timeout of "
                f"{slowest.timeout_s:g} s on the lease (else lease_too_short)"
            )
    if suggested is not None and suggested > request.max_ttl_s:
        found.append(
            f"the suggested TTL {rounded(suggested):g} s is above leases.max_ttl_s "
            f"{request.max_ttl_s:g}: raise the bound, or have holders renew"
        )
    for route in routes:
        # A route whose timeout is above max_ttl_s is in Advice.problems.
        if route.timeout_s > request.max_ttl_s:
            continue
        if request.default_ttl_s is not None and request.default_ttl_s < route.timeout_s:
            found.append(
                f"route {route.name}: leases.default_ttl_s {request.default_ttl_s:g} s is "
                f"below its upstream timeout {route.timeout_s:g} s: holders must pass ttl_s"
            )
    return found


def recommendation(group: GroupAdvice) -> str:
    """One line for people: the TTL (rounded up to a tenth), what it would have cost."""
    if group.suggested_ttl_s is None:
        return f"{group.resource}: no measured turn and no fenced route: nothing to suggest"
    # Up to the tenth (of the printed millisecond value, so the line agrees with the
    # JSON): a shorter lease than the one suggested could cut turns short.
    ttl = float(
        Decimal(repr(rounded(group.suggested_ttl_s))).quantize(
            Decimal("0.1"), rounding=ROUND_CEILING
        )
    )
    if not group.turns_s:
        return f"{group.resource}: suggest ttl_s {ttl:g} (no measured turn: from the routes)"
    parts = [f"false expiry {group.false_expiries_at(ttl)} of {len(group.turns_s)} measured turns"]
    if group.detection_delay_s is not None:
        parts.append(f"a crash waits {group.detection_delay_s:.1f} s on average")
    if group.came_back:
        parts.append(f"{group.came_back} lease(s) expired while their holder was still working")
    return f"{group.resource}: suggest ttl_s {ttl:g}: " + "; ".join(parts)
