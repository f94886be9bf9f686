"""Lease advice from real lease lives, end to end: `fenceproxy serve` and
the demo upstream as processes, workers as processes that hold their leases for
known durations (real sleeps: the work itself), some that outlive their 1 s lease
and come back, some that never return (SIGKILL). Then `fenceproxy lease-advice
--json` and GET /_fence/v1/lease-advice must agree with each other and with what
the test computed itself from the turns it timed (its own nearest-rank code)."""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal
from typing import Any

import pytest

from tests.integration.processes.conftest import (
    UPSTREAM_TIMEOUT_S,
    Stack,
    WorkerProcess,
    http_call,
)

EVENT_TIMEOUT_S = 10.0
# Timed by this test's workers (each 201 and release answer as it arrived) against the
# store's clock at grant and release: a loaded machine's scheduling and round trips.
TURN_TOLERANCE_S = 0.15
# The work of the workers that release in time, seconds: under their 5 s leases.
HOLDS_S = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
SHORT_TTL_S = 1.0
LONG_TTL_S = 5.0
POLL_INTERVAL_S = 0.05
TARGETS = (0.5, 0.1, 0.0)


def nearest_rank_by_hand(turns: list[float], percent: int) -> float:
    """This test's own percentile: k = ceil(p * n / 100), 1-based (integers only)."""
    ordered = sorted(turns)
    k = max(1, -(-percent * len(ordered) // 100))
    return ordered[k - 1]


def worker(stack: Stack, name: str, rule: str, ttl_s: float) -> WorkerProcess:
    return stack.spawn_worker(
        name,
        resource=f"rule:{rule}",
        holder=name,
        ttl_s=ttl_s,
        method="PUT",
        path=f"/rules/{rule}",
    )


def turn_of(process: WorkerProcess, hold_s: float) -> float:
    """Acquire, write, work for `hold_s`, release: the turn as this test timed it."""
    acquired, _ = process.wait_event("acquired", EVENT_TIMEOUT_S)
    process.write({"by": process.name}, f"{process.name}-1")
    wrote, _ = process.wait_event("wrote", EVENT_TIMEOUT_S)
    assert wrote["status"] == 200, wrote
    process.send(f"hold {hold_s}")
    process.send("release")
    released, _ = process.wait_event("released", EVENT_TIMEOUT_S + hold_s)
    assert released["status"] == 200, released
    turn: float = released["at"] - acquired["granted_at"]
    return turn


def advice_query() -> dict[str, str]:
    return {
        "resource": "rule:*",
        "poll_interval": str(POLL_INTERVAL_S),
        "targets": ",".join(f"{t:g}" for t in TARGETS),
    }


@pytest.mark.timeout(60)
def test_the_advice_is_what_the_measured_turns_say(stack: Stack) -> None:
    # Started together, so that their work overlaps and the test stays short.
    in_time = {
        hold: worker(stack, f"steady-{n}", f"steady-{n}", LONG_TTL_S)
        for n, hold in enumerate(HOLDS_S)
    }
    renews_late = worker(stack, "renews-late", "late-renew", SHORT_TTL_S)
    writes_late = worker(stack, "writes-late", "late-write", SHORT_TTL_S)
    released_late = worker(stack, "released-late", "late-release", SHORT_TTL_S)
    crashes = [worker(stack, f"crash-{n}", f"crash-{n}", SHORT_TTL_S) for n in range(2)]
    for process in (renews_late, writes_late, released_late, *crashes):
        process.wait_event("acquired", EVENT_TIMEOUT_S)
    # Never to return: their leases will expire with nobody to come back.
    for process in crashes:
        process.kill()

    turns = [turn_of(process, hold) for hold, process in in_time.items()]

    # The late ones: each waits for its lease to have run out (bounded polling), then
    # comes back with its token, and is refused.
    for resource in ("rule:late-renew", "rule:late-write", "rule:late-release"):
        stack.wait_not_live(resource)
    renews_late.send("renew 5")
    renewed, _ = renews_late.wait_event("renewed", EVENT_TIMEOUT_S)
    assert (renewed["status"], renewed["code"]) == (409, "lease_expired")
    writes_late.write({"by": "writes-late"}, "late-1")
    wrote, _ = writes_late.wait_event("wrote", EVENT_TIMEOUT_S)
    assert (wrote["status"], wrote["code"]) == (409, "lease_expired")
    # Taken over first (superseded), then the old holder's release is stale.
    successor = worker(stack, "successor", "late-release", LONG_TTL_S)
    turns.append(turn_of(successor, 0.2))
    released_late.send("release")
    released, _ = released_late.wait_event("released", EVENT_TIMEOUT_S)
    assert (released["status"], released["code"]) == (409, "stale_epoch")

    from_cli = stack.cli_json(
        "lease-advice",
        *("--resource", "rule:*", "--poll-interval", str(POLL_INTERVAL_S)),
        *("--targets", ",".join(f"{t:g}" for t in TARGETS)),
    )
    query = "&".join(f"{key}={value}" for key, value in advice_query().items())
    answer = http_call(
        stack.proxy_url, "GET", f"/_fence/v1/lease-advice?{query}", headers=stack.admin_headers()
    )
    assert answer.status == 200, answer
    from_api: dict[str, Any] = answer.body
    # One operation behind both, on the same records: the same answer.
    assert from_cli == from_api

    (group,) = from_api["groups"]
    assert group["resource"] == "rule:*"
    assert group["turns"] == len(turns) == len(HOLDS_S) + 1
    for key, percent in (("p50", 50), ("p90", 90), ("p99", 99)):
        assert group["turn_s"][key] == pytest.approx(
            nearest_rank_by_hand(turns, percent), abs=TURN_TOLERANCE_S
        ), key
    longest = max(turns)
    assert group["turn_s"]["max"] == pytest.approx(longest, abs=TURN_TOLERANCE_S)
    for target in TARGETS:
        by_hand = min(t for t in turns if sum(u > t for u in turns) / len(turns) <= target)
        assert group["shortest_lease_s"][f"{target:g}"] == pytest.approx(
            by_hand, abs=TURN_TOLERANCE_S
        ), target
    # Twice the longest turn, unless the upstream timeout needs more.
    expected_ttl = max(2 * longest, max(longest, UPSTREAM_TIMEOUT_S) + UPSTREAM_TIMEOUT_S)
    assert group["suggested_ttl_s"] == pytest.approx(expected_ttl, abs=2 * TURN_TOLERANCE_S)
    delay = group["detection_delay_s"]
    assert delay["expected"] == pytest.approx(
        delay["lease_s"] - delay["turn_s"] / 2 + POLL_INTERVAL_S / 2, abs=0.001
    )
    # Three came back (renew, write, release after a takeover), two never did.
    assert group["expired"] == {"total": 5, "holder_came_back": 3, "never_came_back": 2}
    assert any("fewer than 20" in warning for warning in group["warnings"])
    (route,) = [r for r in from_api["routes"] if r["route"] == "put-rule"]
    assert route["requests"] == len(turns)  # one committed write per turn
    assert route["timeout_s"] == UPSTREAM_TIMEOUT_S
    assert 0 < route["upstream_s"]["max"] < UPSTREAM_TIMEOUT_S

    table = stack.cli("lease-advice", "--resource", "rule:*")
    assert table.returncode == 0, table.stderr
    tenth = Decimal(str(group["suggested_ttl_s"])).quantize(Decimal("0.1"), ROUND_CEILING)
    assert f"rule:*: suggest ttl_s {float(tenth):g}: false expiry 0 of {len(turns)}" in (
        table.stdout
    )
    assert "3 lease(s) expired while their holder was still working" in table.stdout

    metrics = http_call(stack.proxy_url, "GET", "/_fence/metrics").body
    assert 'fenceproxy_lease_false_expiries_total{group="rule:*"} 3.0' in metrics
    assert f'fenceproxy_lease_turn_seconds_count{{group="rule:*"}} {len(turns)}.0' in metrics
