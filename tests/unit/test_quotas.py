"""Quotas on acquires: the `quotas:` block, the acquire-rate token
buckets (bounded whatever the subjects), and the live-lease cap as decide_acquire
applies it. Time is passed in: nothing here waits on a clock."""

from __future__ import annotations

import json

import pytest

from core.codes import ErrorCode
from core.fencing import Grant, LiveLeases, decide_acquire
from core.quotas import AcquireRate, retry_after_s
from core.records import Refusal, ResourceState
from policies import Quotas, load_policy, parse_policy
from proxy.problems import refusal_response
from tests.unit.test_decisions import NOW, TTL, lease, never_leased, refused, state
from tests.unit.test_policies import (
    EXAMPLE,
    VALID,
    assert_single_problem,
    problems_of,
    with_text,
)

# --- the quotas: block --------------------------------------------------------------------


def test_quotas_default_to_limits_no_legitimate_worker_reaches() -> None:
    assert parse_policy(VALID).quotas == Quotas(live_leases=1000, acquires_per_s=50, burst=100)


def test_example_config_states_the_default_quotas() -> None:
    assert load_policy(EXAMPLE).quotas == Quotas()


def test_quotas_block_sets_each_limit_and_keys_left_out_keep_their_defaults() -> None:
    policy = parse_policy(with_text("quotas: {live_leases: 10, acquires_per_s: 2.5}"))
    assert policy.quotas == Quotas(live_leases=10, acquires_per_s=2.5, burst=100)


def test_zero_lifts_a_limit() -> None:
    policy = parse_policy(with_text("quotas: {live_leases: 0, acquires_per_s: 0}"))
    assert (policy.quotas.live_leases, policy.quotas.acquires_per_s) == (0, 0)


@pytest.mark.parametrize("key", ["live_leases", "acquires_per_s", "burst"])
def test_null_is_refused_rather_than_read_as_unlimited(key: str) -> None:
    assert_single_problem(
        with_text("quotas:", f"  {key}: null"), 14, f"quotas.{key}", "0 for unlimited"
    )


def test_a_burst_of_zero_is_refused_with_the_way_to_lift_the_rate() -> None:
    assert_single_problem(
        with_text("quotas: {burst: 0}"), 13, "quotas.burst", "acquires_per_s: 0 lifts"
    )


@pytest.mark.parametrize(
    ("line", "key", "message"),
    [
        ("live_leases: -1", "quotas.live_leases", "must be at least 0"),
        ("live_leases: 2.5", "quotas.live_leases", "expected an integer"),
        ("acquires_per_s: fast", "quotas.acquires_per_s", "expected a number"),
        ("acquires_per_s: .inf", "quotas.acquires_per_s", "expected a finite number"),
        ("burst: -3", "quotas.burst", "must be at least 0"),
        ("per_client: 3", "quotas.per_client", "unknown key"),
    ],
)
def test_bad_quota_values_name_the_key_and_line(line: str, key: str, message: str) -> None:
    assert_single_problem(with_text("quotas:", f"  {line}"), 14, key, message)


def test_quotas_must_be_a_mapping() -> None:
    [problem] = problems_of(with_text("quotas: 5"))
    assert (problem.line, problem.key) == (13, "quotas")
    assert "expected a mapping" in problem.message


# --- Retry-After --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wait_s", "header"), [(0.0, 1), (0.001, 1), (1.0, 1), (1.001, 2), (12.2, 13), (100.0, 100)]
)
def test_retry_after_is_the_wait_rounded_up_and_at_least_one_second(
    wait_s: float, header: int
) -> None:
    assert retry_after_s(wait_s) == header


# --- the acquire-rate buckets -------------------------------------------------------------


def test_a_subject_acquires_its_burst_at_once_then_is_told_when_the_next_token_comes() -> None:
    rate = AcquireRate()
    assert [rate.take("w", 2, 3, NOW) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rate.take("w", 2, 3, NOW) == pytest.approx(0.5)
    # A refusal takes nothing: a quarter second later half a token is still missing.
    assert rate.take("w", 2, 3, NOW + 0.25) == pytest.approx(0.25)
    assert rate.take("w", 2, 3, NOW + 0.5) == 0.0
    assert rate.take("w", 2, 3, NOW + 0.5) == pytest.approx(0.5)


def test_tokens_refill_at_the_rate_up_to_the_burst_and_no_further() -> None:
    rate = AcquireRate()
    for _ in range(3):
        rate.take("w", 1, 3, NOW)
    # An hour idle refills the bucket to its burst, not to 3600 tokens.
    taken = [rate.take("w", 1, 3, NOW + 3600) for _ in range(4)]
    assert taken[:3] == [0.0, 0.0, 0.0] and taken[3] > 0


def test_each_subject_has_its_own_bucket() -> None:
    rate = AcquireRate()
    rate.take("greedy", 1, 1, NOW)
    assert rate.take("greedy", 1, 1, NOW) > 0
    assert rate.take("modest", 1, 1, NOW) == 0.0


def test_a_clock_that_goes_back_neither_adds_nor_takes_tokens() -> None:
    rate = AcquireRate()
    rate.take("w", 1, 1, NOW)
    assert rate.take("w", 1, 1, NOW - 50) == pytest.approx(1.0)
    assert rate.take("w", 1, 1, NOW + 1) == 0.0


def test_rate_zero_is_unlimited_and_tracks_nothing() -> None:
    rate = AcquireRate()
    assert all(rate.take(f"w{i}", 0, 1, NOW) == 0.0 for i in range(100))
    assert len(rate) == 0


def test_tracked_subjects_never_exceed_the_bound_whatever_the_names() -> None:
    rate = AcquireRate(max_subjects=50)
    for i in range(10_000):
        rate.take(f"invented-{i}", 1, 5, NOW + i * 0.0001)
        assert len(rate) <= 50
    assert len(rate) == 50


def test_full_buckets_are_forgotten_before_a_drained_one() -> None:
    rate = AcquireRate(max_subjects=3)
    for _ in range(2):
        rate.take("drained", 1, 2, NOW)  # the least recently used, and empty
    rate.take("quick-1", 10, 2, NOW + 1)
    rate.take("quick-2", 10, 2, NOW + 1)
    # Half a second on, the quick ones are full again; "drained" has 1.5 of 2 tokens.
    rate.take("newcomer", 1, 2, NOW + 1.5)
    assert len(rate) == 2
    assert rate.take("drained", 1, 2, NOW + 1.5) == 0.0
    # It was kept: half a token left, not a fresh burst of two.
    assert rate.take("drained", 1, 2, NOW + 1.5) == pytest.approx(0.5)


def test_without_a_full_bucket_the_least_recently_used_is_forgotten() -> None:
    rate = AcquireRate(max_subjects=2)
    rate.take("first", 0.001, 1, NOW)
    rate.take("second", 0.001, 1, NOW)
    rate.take("third", 0.001, 1, NOW)
    assert len(rate) == 2
    # "first" starts again from a full bucket; "third" is still drained.
    assert rate.take("first", 0.001, 1, NOW) == 0.0
    assert rate.take("third", 0.001, 1, NOW) > 0


def test_a_subject_that_acquires_again_is_no_longer_the_least_recently_used() -> None:
    rate = AcquireRate(max_subjects=2)
    rate.take("busy", 0.001, 2, NOW)
    rate.take("idle", 0.001, 2, NOW)
    rate.take("busy", 0.001, 2, NOW + 1)  # "idle" is now the one seen longest ago
    rate.take("newcomer", 0.001, 2, NOW + 2)
    # "busy" kept its drained bucket; "idle" was forgotten and starts from a full one.
    assert rate.take("busy", 0.001, 2, NOW + 2) > 0
    assert [rate.take("idle", 0.001, 2, NOW + 2) for _ in range(2)] == [0.0, 0.0]


def test_by_default_the_buckets_of_4096_subjects_are_kept_as_the_guide_says() -> None:
    rate = AcquireRate()
    for i in range(4096):
        rate.take(f"subject-{i}", 0.001, 1, NOW)
    assert len(rate) == 4096
    rate.take("one-more", 0.001, 1, NOW)
    assert len(rate) == 4096


def test_a_newcomer_looks_for_full_buckets_among_the_64_least_recently_used_only() -> None:
    # The scan is bounded so that a flood of new names costs the same for each.
    rate = AcquireRate(max_subjects=100)
    for i in range(63):
        rate.take(f"drained-{i}", 0.001, 1, NOW)  # refills in 1000 s
    rate.take("quick-64th", 10, 1, NOW)  # full again 0.1 s later
    rate.take("quick-65th", 10, 1, NOW)
    for i in range(35):
        rate.take(f"recent-{i}", 0.001, 1, NOW)
    rate.take("newcomer", 0.001, 1, NOW + 1)
    # The 64th least recently used was full and made the room alone (the 65th, as full,
    # was not looked at), and the least recently used, drained, was kept.
    assert len(rate) == 100
    assert rate.take("drained-0", 0.001, 1, NOW + 1) > 0


# --- the live-lease cap -------------------------------------------------------------------


def capped(count: int, earliest: float | None = NOW + 12.2, cap: int = 3) -> LiveLeases:
    return LiveLeases("worker-1", cap, count, earliest)


def test_a_subject_below_its_live_lease_cap_is_granted() -> None:
    assert decide_acquire(never_leased(), TTL, NOW, capped(2)) == Grant(1, NOW + TTL)


def test_a_subject_at_its_cap_is_rate_limited_until_its_first_lease_expires() -> None:
    refusal = refused(decide_acquire(never_leased(), TTL, NOW, capped(3)), "rate_limited")
    assert refusal.context == {
        "resource": "supplier:widget",
        "live_leases": 3,
        "retry_after_s": 13,
    }
    assert "worker-1 holds 3 live leases" in refusal.detail


def test_a_lease_expiring_in_under_a_second_still_says_retry_after_one() -> None:
    refusal = refused(
        decide_acquire(never_leased(), TTL, NOW, capped(3, earliest=NOW + 0.01)), "rate_limited"
    )
    assert refusal.context["retry_after_s"] == 1


def test_a_held_resource_is_lease_held_whatever_the_subject_holds() -> None:
    held: ResourceState = state(lease(expires_at=NOW + 5))
    refused(decide_acquire(held, TTL, NOW, capped(3)), "lease_held")


def test_rate_limited_answers_429_with_retry_after() -> None:
    refusal = Refusal(ErrorCode.RATE_LIMITED, "too fast", {"resource": "r", "retry_after_s": 4})
    response = refusal_response(refusal)
    assert response.status == 429
    assert response.headers["Retry-After"] == "4"
    assert response.content_type == "application/problem+json"
    assert isinstance(response.body, bytes)
    assert json.loads(response.body)["code"] == "rate_limited"
