"""The lease-sizing math (core/lease_turns.py, core/leasing_advice.py),
pinned by the worked example and its edge cases."""

from __future__ import annotations

import math

import pytest

from core.lease_turns import (
    default_grid,
    detection_delay,
    nearest_rank,
    share_outliving,
    shortest_lease,
    suggested_ttl,
    ttl_floor,
    turn_stats,
)
from core.leasing_advice import (
    AdviceRequest,
    GroupAdvice,
    LeaseLife,
    RouteSpec,
    advise,
    group_of,
    recommendation,
    routes_of_group,
    template_glob,
)

# 40 turns with p50 0.539, p90 1.334, p99 = max 2.669 (the issue's worked example): 5
# at or below 0.25 s, 15 at or below 0.5 s, t20 = 0.539, t36 = 1.334, t38 = 1.449.
WORKED = sorted(
    [0.1, 0.15, 0.2, 0.22, 0.25]
    + [0.3, 0.32, 0.34, 0.36, 0.38, 0.4, 0.42, 0.44, 0.46, 0.5]
    + [0.51, 0.52, 0.53, 0.535, 0.539]
    + [round(0.6 + 0.04 * i, 3) for i in range(15)]
    + [1.334, 1.4, 1.449, 2.0, 2.669]
)
TARGETS = (0.5, 0.1, 0.05, 0.0)


def test_the_worked_example_has_the_issues_statistics() -> None:
    assert len(WORKED) == 40
    assert nearest_rank(WORKED, 50) == 0.539
    assert nearest_rank(WORKED, 90) == 1.334
    assert nearest_rank(WORKED, 99) == 2.669
    assert WORKED[-1] == 2.669


def test_the_worked_example_suggests_twice_the_longest_turn() -> None:
    assert suggested_ttl(2.669, 2, 0.0) == 5.338


def test_the_worked_example_detection_delay_is_t_minus_half_d_plus_half_s() -> None:
    # 5.338 - 0.539/2 + 0.05/2 = 5.0935, which a float sum lands just under.
    assert detection_delay(5.338, 0.539, 0.05) == 5.094


def test_the_shortest_lease_for_half_the_turns_is_the_median() -> None:
    assert shortest_lease(WORKED, 0.5) == nearest_rank(WORKED, 50) == 0.539
    assert {t: shortest_lease(WORKED, t) for t in TARGETS} == {
        0.5: 0.539,
        0.1: 1.334,
        0.05: 1.449,
        0.0: 2.669,
    }


def test_the_share_outliving_a_lease_counts_strictly_longer_turns() -> None:
    assert share_outliving(WORKED, 0.25) == 0.875
    assert share_outliving(WORKED, 0.5) == 0.625
    assert share_outliving(WORKED, 0.539) == 0.5
    assert share_outliving(WORKED, 2.669) == 0.0
    assert share_outliving([], 1.0) == 0.0


def test_the_default_grid_is_a_round_step_up_to_the_longest_turn() -> None:
    grid = default_grid(WORKED)
    assert grid[:2] == (0.25, 0.5)
    assert grid[-1] == 2.75
    assert len(grid) == 11
    assert default_grid([]) == ()


@pytest.mark.parametrize(
    ("longest", "step", "last"),
    [
        (12.0, 1.0, 12.0),  # a step of 1 gives the 12 points exactly
        (24.0, 2.0, 24.0),  # a turn on a point ends the grid there
        (25.0, 2.5, 25.0),  # 25/12 is over 2: the next round step
        (48.0, 5.0, 50.0),
        (84.0, 10.0, 90.0),  # 84/12 is over 5: the next power of ten
        (0.288, 0.025, 0.3),  # the round steps of 10^-2
        (0.4, 0.05, 0.4),
    ],
)
def test_the_default_grid_steps_by_the_smallest_round_step_of_about_twelve_points(
    longest: float, step: float, last: float
) -> None:
    grid = default_grid([longest / 2, longest])
    assert grid[0] == step
    assert grid[-1] == last
    assert len(grid) == round(last / step)


def test_turns_that_all_took_no_time_give_no_grid_and_a_zero_first_turn_is_no_matter() -> None:
    assert default_grid([0.0, 0.0]) == ()
    assert default_grid([0.0, 5.0])[-1] == 5.0


def test_nearest_rank_divides_by_a_hundred_exactly() -> None:
    # ceil(99 * 200 / 100) = 198: a rank just past a whole number is not rounded down.
    assert nearest_rank([float(i) for i in range(1, 201)], 99) == 198.0


def test_without_measured_turns_the_suggestion_is_the_floor_from_the_routes() -> None:
    assert suggested_ttl(None, 2.0, 0.5) == 0.5
    assert ttl_floor(None, [0.5]) == 1.0  # twice a timeout under a second, too


def test_the_whole_group_answer_for_the_worked_example() -> None:
    lives = [_released(f"rule:r{i}", turn) for i, turn in enumerate(WORKED)]
    request = AdviceRequest(resource=None, since_s=None, poll_interval_s=0.05)
    advice = advise(lives, [], [RouteSpec("put-rule", "rule:*", 0.5)], request, NOW)
    (group,) = advice.as_json()["groups"]
    assert group["resource"] == "rule:*"
    assert group["turns"] == 40
    assert group["turn_s"] == {"p50": 0.539, "p90": 1.334, "p99": 2.669, "max": 2.669}
    assert group["shortest_lease_s"] == {"0.5": 0.539, "0.1": 1.334, "0.05": 1.449, "0": 2.669}
    assert group["false_expiry_curve"][:2] == [
        {"lease_s": 0.25, "share": 0.875},
        {"lease_s": 0.5, "share": 0.625},
    ]
    assert group["suggested_ttl_s"] == 5.338
    assert group["detection_delay_s"] == {
        "lease_s": 5.338,
        "turn_s": 0.539,
        "poll_interval_s": 0.05,
        "expected": 5.094,
    }
    assert group["expired"] == {"total": 0, "holder_came_back": 0, "never_came_back": 0}
    assert recommendation(advice.groups[0]).startswith(
        "rule:*: suggest ttl_s 5.4: false expiry 0 of 40 measured turns; "
        "a crash waits 5.1 s on average"
    )


# -- edge cases --------------------------------------------------------------------------


def test_one_turn_is_every_percentile_and_every_shortest_lease() -> None:
    stats = turn_stats([0.7], TARGETS, None)
    assert stats.percentiles == {50: 0.7, 90: 0.7, 99: 0.7}
    assert stats.shortest_lease == dict.fromkeys(TARGETS, 0.7)


def test_ties_count_as_one_lease_that_no_tied_turn_outlives() -> None:
    turns = [1.0, 1.0, 1.0, 2.0]
    assert share_outliving(turns, 1.0) == 0.25
    assert shortest_lease(turns, 0.5) == 1.0
    assert shortest_lease(turns, 0.2) == 2.0
    assert nearest_rank(turns, 50) == 1.0
    assert nearest_rank(turns, 75) == 1.0
    assert nearest_rank(turns, 76) == 2.0


def test_a_target_below_one_turn_in_n_needs_the_longest_turn() -> None:
    # No turn but the longest keeps the rate at or below 1%: 1 of 40 is 2.5%.
    assert shortest_lease(WORKED, 0.01) == 2.669
    assert shortest_lease(WORKED, 0.025) == 2.0


def test_nearest_rank_is_exact_and_at_least_one() -> None:
    turns = [float(i) for i in range(1, 101)]
    assert nearest_rank(turns, 99) == 99.0  # ceil(0.99 * 100) = 99, not 100
    assert nearest_rank(turns, 0) == 1.0
    assert nearest_rank([3.0, 4.0], 1) == 3.0


def test_no_turns_give_nulls_not_zeros() -> None:
    stats = turn_stats([], TARGETS, (1.0, 2.0))
    assert stats.percentiles is None
    assert stats.longest is None
    assert stats.shortest_lease == dict.fromkeys(TARGETS)
    assert stats.curve == ()
    advice = advise([], [], [], AdviceRequest(resource="job:*", since_s=None), NOW)
    (group,) = advice.as_json()["groups"]
    assert group["turn_s"] is None
    assert group["shortest_lease_s"] is None
    assert group["suggested_ttl_s"] is None
    assert group["detection_delay_s"] is None
    assert group["turns"] == 0
    assert any("fewer than 20" in warning for warning in group["warnings"])


# -- the floor from the routes' upstream timeouts ------------------------------------------


def test_the_ttl_is_raised_so_that_a_write_at_the_end_of_the_longest_turn_fits() -> None:
    assert ttl_floor(7.0, [5.0, 1.0]) == 12.0
    assert suggested_ttl(7.0, 1.5, ttl_floor(7.0, [5.0])) == 12.0
    assert suggested_ttl(7.0, 2, ttl_floor(7.0, [5.0])) == 14.0
    # A turn shorter than one timeout counts as one: twice the timeout, as the
    # configuration-only advice said.
    assert ttl_floor(0.1, [5.0]) == 10.0
    assert ttl_floor(None, [5.0]) == 10.0
    assert ttl_floor(3.0, []) == 0.0


def test_a_raised_ttl_says_why_and_is_never_below_the_policys_minimum() -> None:
    lives = [_released("rule:a", 0.5)]
    request = AdviceRequest(resource=None, since_s=None, min_ttl_s=20.0)
    advice = advise(lives, [], [RouteSpec("put-rule", "rule:*", 5.0)], request, NOW)
    assert advice.groups[0].suggested_ttl_s == 20.0
    request = AdviceRequest(resource=None, since_s=None)
    advice = advise(lives, [], [RouteSpec("put-rule", "rule:*", 5.0)], request, NOW)
    assert advice.groups[0].suggested_ttl_s == 10.0
    assert any("raised to 10 s" in warning for warning in advice.groups[0].warnings)


def test_a_route_whose_timeout_exceeds_max_ttl_is_a_problem() -> None:
    request = AdviceRequest(resource=None, since_s=None, max_ttl_s=3.0)
    advice = advise([], [], [RouteSpec("put-rule", "rule:*", 5.0)], request, NOW)
    assert advice.problems and "every write is refused" in advice.problems[0]


# -- groups ----------------------------------------------------------------------------------


def test_groups_come_from_route_templates_then_prefixes() -> None:
    assert template_glob("rule:{rule_id}") == "rule:*"
    assert template_glob("tenant:{t}/doc:{id:[0-9]{3}}") == "tenant:*/doc:*"
    assert group_of("rule:r1", ["rule:*"]) == "rule:*"
    assert group_of("job:42", ["rule:*"]) == "job:*"
    assert group_of("plain", ["rule:*"]) == "*"
    routes = [RouteSpec("put-rule", "rule:*", 1.0), RouteSpec("order", "supplier:*", 2.0)]
    assert [r.name for r in routes_of_group("rule:r1", routes)] == ["put-rule"]
    assert [r.name for r in routes_of_group("*", routes)] == ["put-rule", "order"]
    assert routes_of_group("job:*", routes) == []


def test_a_resource_glob_makes_one_group_of_what_it_matches() -> None:
    lives = [_released("rule:a", 1.0), _released("rule:b", 2.0), _released("job:1", 3.0)]
    advice = advise(lives, [], [], AdviceRequest(resource="rule:*", since_s=None), NOW)
    (group,) = advice.groups
    assert (group.resource, group.stats.turns, group.stats.longest) == ("rule:*", 2, 2.0)


def test_made_up_prefixes_cannot_grow_the_groups_without_bound() -> None:
    lives = [_released(f"p{i}:x", 1.0) for i in range(200)]
    advice = advise(lives, [], [], AdviceRequest(resource=None, since_s=None), NOW)
    assert len(advice.groups) == 51
    assert sum(group.stats.turns for group in advice.groups) == 200


# -- how leases ended -----------------------------------------------------------------------


def test_expired_leases_are_split_by_whether_their_holder_came_back() -> None:
    lives = [
        _life("job:1", ended_at=None, expires_at=NOW - 1, came_back_at=NOW),
        _life("job:2", ended_at=None, expires_at=NOW - 1),
        _life("job:3", ended_at=NOW - 0.5, expires_at=NOW - 1, end_reason="superseded"),
        _life("job:4", ended_at=None, expires_at=NOW + 10),  # live
        _life("job:5", ended_at=NOW - 5, expires_at=NOW - 1, end_reason="revoked: x"),
    ]
    advice = advise(lives, [], [], AdviceRequest(resource=None, since_s=None), NOW)
    assert advice.as_json()["groups"][0]["expired"] == {
        # job:3 expired before it was taken over; job:5 was revoked before it expired.
        "total": 3,
        "holder_came_back": 1,
        "never_came_back": 2,
    }
    assert [life.ending(NOW) for life in lives] == [
        "expired",
        "expired",
        "superseded",
        None,
        "revoked",
    ]


def test_route_latencies_warn_when_the_timeout_sits_inside_the_tail() -> None:
    routes = [RouteSpec("put-rule", "rule:*", 0.5)]
    slow = [("put-rule", 0.1)] * 98 + [("put-rule", 0.5), ("put-rule", 0.5)]
    advice = advise([], slow, routes, AdviceRequest(resource=None, since_s=None), NOW)
    (route,) = advice.as_json()["routes"]
    assert route["requests"] == 100
    assert route["upstream_s"] == {"p50": 0.1, "p99": 0.5, "max": 0.5}
    assert route["warnings"]
    fast = [("put-rule", 0.1)] * 100
    advice = advise([], fast, routes, AdviceRequest(resource=None, since_s=None), NOW)
    assert advice.as_json()["routes"][0]["warnings"] == []


def test_a_route_tail_is_its_nearest_rank_percentiles_and_warns_from_p99_on() -> None:
    latencies = [("put-rule", i / 100) for i in range(100, 0, -1)]  # 0.01 ... 1.0
    request = AdviceRequest(resource=None, since_s=None)
    within = advise([], latencies, [RouteSpec("put-rule", "rule:*", 1.0)], request, NOW)
    assert within.as_json()["routes"] == [
        {
            "route": "put-rule",
            "requests": 100,
            "upstream_s": {"p50": 0.5, "p99": 0.99, "max": 1.0},
            "timeout_s": 1.0,
            "warnings": [],
        }
    ]
    inside = advise([], latencies, [RouteSpec("put-rule", "rule:*", 0.99)], request, NOW)
    assert inside.routes[0].warnings() == [
        "route put-rule: the upstream timeout 0.99 s sits inside the measured tail "
        "(p99 0.99 s): slow answers are cut off and their outcome becomes unknown"
    ]


# -- warnings, JSON and the line for people -------------------------------------------------


def _group(
    lives: list[LeaseLife],
    routes: tuple[RouteSpec, ...] = (),
    *,
    margin: float = 2.0,
    max_ttl_s: float = math.inf,
    default_ttl_s: float | None = None,
) -> GroupAdvice:
    request = AdviceRequest(
        resource="rule:*",
        since_s=None,
        margin=margin,
        max_ttl_s=max_ttl_s,
        default_ttl_s=default_ttl_s,
    )
    (group,) = advise(lives, [], routes, request, NOW).groups
    return group


def _turns(*turns: float) -> list[LeaseLife]:
    return [_released(f"rule:r{i}", turn) for i, turn in enumerate(turns)]


def test_fewer_than_twenty_turns_are_warned_about_twenty_are_not() -> None:
    warned = (
        "the advice rests on 19 measured turn(s), fewer than 20: measure more before trusting it"
    )
    assert warned in _group(_turns(*[1.0] * 19)).warnings
    assert not any("fewer than" in w for w in _group(_turns(*[1.0] * 20)).warnings)


def test_a_requested_ttl_that_turns_outlive_is_warned_about_with_its_share() -> None:
    lives = [
        _released("rule:a", 0.5, ttl_s=None),
        _released("rule:b", 1.0, ttl_s=5.0),
        _released("rule:c", 0.7, ttl_s=1.0),
        _released("rule:d", 2.0, ttl_s=2.0),
    ]
    # The shortest TTL asked for is 1 s; the 1 s turn does not outlive it, the 2 s one does.
    assert (
        "holders request 1 s but 25% of turns take longer than that (1 of 4): "
        "those leases expire under live workers unless they renew"
    ) in _group(lives).warnings
    outlived_by_none = [_released("rule:a", 0.5, ttl_s=2.0), _released("rule:b", 2.0, ttl_s=2.0)]
    assert not any("holders request" in w for w in _group(outlived_by_none).warnings)
    # Leases granted before their TTL was recorded say nothing about it.
    untold = [_released("rule:a", 0.5, ttl_s=None), _released("rule:b", 2.0, ttl_s=None)]
    assert not any("holders request" in w for w in _group(untold).warnings)


def test_false_expiries_measured_are_warned_about_and_told_in_the_line() -> None:
    came_back = _life("rule:x", ended_at=None, expires_at=NOW - 1, came_back_at=NOW)
    group = _group([*_turns(1.0), came_back])
    said = "1 lease(s) expired while their holder was still working"
    assert f"{said} (measured false expiries)" in group.warnings
    assert recommendation(group).endswith(f"; {said}")
    assert not any(said in w for w in _group(_turns(1.0)).warnings)


def test_a_ttl_raised_for_the_slowest_route_says_so_only_when_raised() -> None:
    routes = (RouteSpec("fast", "rule:*", 0.1), RouteSpec("slow", "rule:*", 0.3))
    # 2 x 0.1 s measured; the slowest route needs max(0.1, 0.3) + 0.3 s.
    assert _group(_turns(0.1), routes).warnings[1:] == (
        "raised to 0.6 s: a write at the end of the longest turn must still find route "
        "slow's upstream timeout of 0.3 s on the lease (else lease_too_short)",
    )
    # The floor equal to what was measured (2 x 5 = 5 + 5) raised nothing.
    assert _group(_turns(5.0), (RouteSpec("slow", "rule:*", 5.0),)).warnings[1:] == ()
    # Without a turn the routes' floor is the suggestion itself: nothing was raised.
    assert _group([], routes).warnings[1:] == ()


def test_a_suggestion_above_max_ttl_is_warned_about_one_at_it_is_not() -> None:
    assert _group(_turns(7.0), max_ttl_s=10.0).warnings[1:] == (
        "the suggested TTL 14 s is above leases.max_ttl_s 10: raise the bound, "
        "or have holders renew",
    )
    assert _group(_turns(7.0), max_ttl_s=14.0).warnings[1:] == ()


def test_a_default_ttl_below_a_route_timeout_is_warned_about_per_route() -> None:
    route = (RouteSpec("put-rule", "rule:*", 5.0),)
    below = "route put-rule: leases.default_ttl_s 3 s is below its upstream timeout 5 s"
    assert f"{below}: holders must pass ttl_s" in _group([], route, default_ttl_s=3.0).warnings
    assert not any("default_ttl_s" in w for w in _group([], route, default_ttl_s=5.0).warnings)
    # A timeout equal to max_ttl_s is no problem and still warned about.
    at_max = _group([], route, default_ttl_s=3.0, max_ttl_s=5.0)
    assert any(below in w for w in at_max.warnings)
    request = AdviceRequest(resource="rule:*", since_s=None, max_ttl_s=5.0)
    assert advise([], [], route, request, NOW).problems == ()
    # Above it the route is a problem of the advice, not a warning of the group.
    above = _group([], route, default_ttl_s=3.0, max_ttl_s=4.0)
    assert not any(below in w for w in above.warnings)


def test_the_ttls_in_use_and_the_endings_are_in_the_json() -> None:
    lives = [_released(f"rule:r{i}", 0.5, ttl_s=float(i)) for i in range(1, 52)]
    lives += [
        _released("rule:untold", 0.5, ttl_s=None),
        _life("rule:revoked", ended_at=NOW - 5, expires_at=NOW + 5, end_reason="revoked: x"),
        _life("rule:live", ended_at=None, expires_at=NOW + 5),
    ]
    advice = advise(lives, [], [], AdviceRequest(resource="rule:*", since_s=None), NOW)
    answer = advice.as_json()
    (group,) = answer["groups"]
    # 53 TTLs (the two _life ones are 30 s): the 27th is the median, 1 s the shortest.
    assert group["ttls_in_use_s"] == {"p50": 27.0, "min": 1.0}
    assert group["ended"] == {"total": 53, "released": 52, "revoked": 1}
    assert answer["leases_ended"] == 53
    assert answer["problems"] == []


def test_how_a_lease_ended_at_the_boundaries() -> None:
    assert _life("r", ended_at=None, expires_at=NOW).ending(NOW) == "expired"
    assert _released("r", 1.0).ending(NOW) == "released"
    revoked = _life("r", ended_at=NOW - 5, expires_at=NOW + 5, end_reason="revoked: x")
    assert revoked.turn_s() is None  # only a release measures a turn
    assert _life("r", ended_at=NOW - 1, expires_at=NOW - 1).expired(NOW)


def test_the_line_for_people_without_turns_and_with_false_expiries() -> None:
    assert recommendation(_group([])) == (
        "rule:*: no measured turn and no fenced route: nothing to suggest"
    )
    assert recommendation(_group([], (RouteSpec("put-rule", "rule:*", 0.5),))) == (
        "rule:*: suggest ttl_s 1 (no measured turn: from the routes)"
    )
    # Half the longest turn cuts the longest one short (and not the one it equals).
    short = _group(_turns(0.5, 1.0, 1.5, 3.0), margin=0.5)
    assert recommendation(short).startswith(
        "rule:*: suggest ttl_s 1.5: false expiry 1 of 4 measured turns;"
    )


def test_turns_without_a_route_suggest_the_margin_times_the_longest_polled_each_second() -> None:
    group = _group(_turns(0.1, 0.2))
    answer = group.as_json()
    assert answer["suggested_ttl_s"] == 0.4  # not raised to any minimum: none was given
    assert answer["detection_delay_s"]["poll_interval_s"] == 1.0


def test_the_busiest_prefixes_keep_their_groups_and_a_routes_group_is_never_folded() -> None:
    request = AdviceRequest(resource=None, since_s=None)
    fifty = [_released(f"p{i}:x", 1.0) for i in range(50)]
    names = [g.resource for g in advise(fifty, [], [], request, NOW).groups]
    assert len(names) == 50 and "*" not in names
    lives = [*fifty, _released("zz:1", 1.0), _released("zz:2", 1.0)]
    routes = [RouteSpec("put-rule", "rule:*", 1.0)]
    groups = {g.resource: g for g in advise(lives, [], routes, request, NOW).groups}
    # 51 prefixes: the busiest stays, the last by name of the least busy is folded.
    assert "zz:*" in groups and "p9:*" not in groups
    assert groups["*"].stats.turns == 1
    assert "rule:*" in groups


NOW = 1_000_000.0


def _life(
    resource: str,
    *,
    ended_at: float | None,
    expires_at: float,
    end_reason: str | None = None,
    came_back_at: float | None = None,
) -> LeaseLife:
    return LeaseLife(
        resource=resource,
        epoch=1,
        granted_at=NOW - 100,
        expires_at=expires_at,
        ended_at=ended_at,
        end_reason=end_reason,
        granted_ttl_s=30.0,
        renewals=0,
        came_back_at=came_back_at,
    )


def _released(resource: str, turn_s: float, ttl_s: float | None = 30.0) -> LeaseLife:
    granted = NOW - 100
    return LeaseLife(
        resource=resource,
        epoch=1,
        granted_at=granted,
        expires_at=granted + 30,
        ended_at=granted + turn_s,
        end_reason="released",
        granted_ttl_s=ttl_s,
        renewals=0,
        came_back_at=None,
    )


@pytest.mark.parametrize("percent", [50, 90, 99])
def test_percentiles_of_no_turns_are_none(percent: int) -> None:
    assert nearest_rank([], percent) is None
