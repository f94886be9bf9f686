"""The lease metrics' labels stay bounded whatever names clients lease."""

from __future__ import annotations

from proxy.metrics import MAX_PREFIX_LABELS, Metrics
from store import CAME_BACK


def test_groups_are_route_templates_then_the_first_prefixes_then_one_catch_all() -> None:
    metrics = Metrics()
    metrics.route_groups = ("rule:*",)
    assert metrics.lease_group("rule:r1") == "rule:*"
    prefixes = [metrics.lease_group(f"p{i}:x") for i in range(MAX_PREFIX_LABELS + 5)]
    assert prefixes[:MAX_PREFIX_LABELS] == [f"p{i}:*" for i in range(MAX_PREFIX_LABELS)]
    assert set(prefixes[MAX_PREFIX_LABELS:]) == {"*"}
    # A prefix seen before keeps its label; a route template always has one.
    assert metrics.lease_group("p0:y") == "p0:*"
    assert metrics.lease_group("rule:r2") == "rule:*"


def test_a_release_is_a_turn_and_a_came_back_is_a_false_expiry() -> None:
    metrics = Metrics()
    metrics.route_groups = ("rule:*",)
    metrics.observe_lease("rule:a", "released", 1.5)
    metrics.observe_lease("rule:a", CAME_BACK, None)
    metrics.observe_lease("rule:b", "superseded", None)
    registry = metrics.registry
    assert (
        registry.get_sample_value("fenceproxy_lease_turn_seconds_sum", {"group": "rule:*"}) == 1.5
    )
    assert (
        registry.get_sample_value("fenceproxy_lease_false_expiries_total", {"group": "rule:*"}) == 1
    )
    ended = {
        how: registry.get_sample_value(
            "fenceproxy_leases_ended_total", {"group": "rule:*", "how": how}
        )
        for how in ("released", "superseded")
    }
    assert ended == {"released": 1, "superseded": 1}
