"""The false-expiry math of lease sizing, as pure functions.

A *turn* is the time from a grant to its holder's release: how long the work really
took. A lease shorter than a turn expires under a live worker (a false expiry); a
longer one makes a crash wait (the detection delay). Everything here is exact and
pinned by tests/unit/test_leasing_advice.py; nothing performs I/O or reads a clock.

Decimal arithmetic where a result is printed to the millisecond: a float sum such as
5.338 - 0.2695 + 0.025 lands on 5.09349999..., which would round the wrong way.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal
from fractions import Fraction

PERCENTILES = (50, 90, 99)
# About this many points in the default false-expiry curve, on a round step.
CURVE_POINTS = 12
_ROUND_STEPS = (1, 2, 2.5, 5)
_MILLISECOND = Decimal("0.001")
# Room for any float's digits to the millisecond: quantize refuses (InvalidOperation)
# a result longer than its context's precision, and the default is 28 digits.
_WIDE = Context(prec=400)


def rounded(value: float) -> float:
    """To the millisecond, halves up, as the advice prints every duration."""
    return float(Decimal(repr(value)).quantize(_MILLISECOND, ROUND_HALF_UP, _WIDE))


def nearest_rank(turns: Sequence[float], percent: float) -> float | None:
    """pX = t_k with k = ceil(X/100 * n), k >= 1, of turns sorted ascending; None if
    there are none. The rank is computed exactly (0.9 * 40 is 36, not 36.000...1)."""
    if not turns:
        return None
    rank = math.ceil(Fraction(repr(percent)) * len(turns) / 100)
    return turns[max(1, rank) - 1]


def share_outliving(turns: Sequence[float], lease_s: float) -> float:
    """|{t > lease_s}| / n of turns sorted ascending: the false-expiry rate of `lease_s`
    for work that does not renew."""
    if not turns:
        return 0.0
    return (len(turns) - bisect_right(turns, lease_s)) / len(turns)


def shortest_lease(turns: Sequence[float], target: float) -> float | None:
    """The smallest observed turn whose share of longer turns is at most `target`
    (target 0 gives the longest turn); None without turns. Turns sorted ascending, so
    the share only falls along them: the first that meets the target is the answer."""
    for turn in turns:
        if share_outliving(turns, turn) <= target:
            return turn
    return None


def detection_delay(lease_s: float, typical_turn_s: float, poll_interval_s: float) -> float:
    """E = T - D/2 + s/2: a crash falls uniformly within a turn of length D, the lease
    then runs out T - D/2 later on average, and a successor polling every s seconds
    notices s/2 after that."""
    delay = _WIDE.add(
        _WIDE.subtract(Decimal(repr(lease_s)), _WIDE.divide(Decimal(repr(typical_turn_s)), 2)),
        _WIDE.divide(Decimal(repr(poll_interval_s)), 2),
    )
    return float(delay.quantize(_MILLISECOND, ROUND_HALF_UP, _WIDE))


def default_grid(turns: Sequence[float]) -> tuple[float, ...]:
    """Round lease lengths from one step up to the first that no turn outlives: the step
    is the smallest of 1, 2, 2.5, 5 x 10^k that gives about CURVE_POINTS points."""
    if not turns or turns[-1] <= 0:
        return ()
    longest = turns[-1]
    wanted = longest / CURVE_POINTS
    exponent = math.floor(math.log10(wanted))
    step = next(
        Decimal(str(base)) * Decimal(10) ** exponent
        for base in (*_ROUND_STEPS, 10)
        if Decimal(str(base)) * Decimal(10) ** exponent >= Decimal(repr(wanted))
    )
    points: list[float] = []
    lease = step
    while True:
        points.append(float(lease))
        if float(lease) >= longest:
            return tuple(points)
        lease += step


def suggested_ttl(longest_turn_s: float | None, margin: float, floor_s: float) -> float:
    """margin x the longest turn, raised to `floor_s` (what the group's routes need so
    that `lease_too_short` never refuses a write: see `ttl_floor`)."""
    measured = float(Decimal(repr(margin)) * Decimal(repr(longest_turn_s or 0.0)))
    return max(measured, floor_s)


def ttl_floor(longest_turn_s: float | None, upstream_timeouts_s: Iterable[float]) -> float:
    """The shortest lease under which no write of a measured turn is refused as
    `lease_too_short`: a write may come at the end of the longest turn and must still
    find the route's upstream timeout left on the lease. A turn shorter than one
    timeout counts as one (time to take the lease and send, and a renewal's round
    trip: without measured turns this is the configuration-only advice, twice the
    timeout)."""
    timeout = max(upstream_timeouts_s, default=0.0)
    if timeout == 0.0:
        return 0.0
    longest = max(Decimal(repr(longest_turn_s or 0.0)), Decimal(repr(timeout)))
    return float(longest + Decimal(repr(timeout)))


@dataclass(frozen=True)
class TurnStats:
    """What one group's turns say, for a grid of leases and a list of target rates."""

    turns: int
    percentiles: dict[int, float] | None  # None: no turn
    longest: float | None
    shortest_lease: dict[float, float | None]
    curve: tuple[tuple[float, float], ...]  # (lease_s, share outliving it)


def turn_stats(
    durations: Iterable[float], targets: Sequence[float], grid: Sequence[float] | None
) -> TurnStats:
    turns = sorted(durations)
    leases = default_grid(turns) if grid is None else tuple(grid)
    percentiles = None
    if turns:
        percentiles = {p: rank for p in PERCENTILES if (rank := nearest_rank(turns, p)) is not None}
    return TurnStats(
        turns=len(turns),
        percentiles=percentiles,
        longest=turns[-1] if turns else None,
        shortest_lease={target: shortest_lease(turns, target) for target in targets},
        # A share of no turns means nothing: no curve without turns.
        curve=tuple((lease, share_outliving(turns, lease)) for lease in leases) if turns else (),
    )
