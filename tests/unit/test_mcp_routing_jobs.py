"""The MCP routing example's job table (examples/mcp_routing/jobs.py), with a fake clock:
what may be claimed, and what a worker whose claim is stale may still write."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.mcp_routing.jobs import (
    BLOCKED,
    CANCELLED,
    DONE,
    FAILED,
    MAX_SAME_FAILURES,
    PENDING,
    RETRY_DELAY_S,
    RUNNING,
    JobStore,
    Outcome,
    blocked_next_step,
)

CLAIM_TTL_S = 2.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def jobs(tmp_path: Path, clock: FakeClock) -> Iterator[JobStore]:
    store = JobStore(tmp_path, clock)
    yield store
    store.close()


def test_a_pending_job_is_claimed_once_oldest_first(jobs: JobStore, clock: FakeClock) -> None:
    first = jobs.enqueue("r1", "eu-west")
    clock.now += 1
    second = jobs.enqueue("r2", "us-east")

    claimed = [jobs.claim("w1", 11, CLAIM_TTL_S), jobs.claim("w2", 12, CLAIM_TTL_S)]

    assert [(c.job_id, c.generation) for c in claimed if c] == [(first, 1), (second, 1)]
    assert jobs.claim("w3", 13, CLAIM_TTL_S) is None


def test_a_running_job_is_claimed_again_only_once_its_claim_expired(
    jobs: JobStore, clock: FakeClock
) -> None:
    job_id = jobs.enqueue("r1", "eu-west")
    first = jobs.claim("w1", 11, CLAIM_TTL_S)
    assert first is not None

    clock.now += CLAIM_TTL_S - 0.1
    assert jobs.claim("w2", 12, CLAIM_TTL_S) is None
    assert not jobs.has_lapsed_claim("w1")
    clock.now += 0.2
    assert jobs.has_lapsed_claim("w1")

    second = jobs.claim("w2", 12, CLAIM_TTL_S)

    assert second is not None
    assert (second.job_id, second.generation, second.worker) == (job_id, 2, "w2")
    # Claimed again by another worker before the supervisor noticed: still lapsed.
    assert jobs.has_lapsed_claim("w1")
    assert not jobs.has_lapsed_claim("w2")
    status = jobs.status(job_id)
    assert status is not None
    assert (status["state"], status["claimed_by"]) == (RUNNING, "w2")
    assert [(a["worker"], a["generation"]) for a in status["attempts"]] == [("w1", 1), ("w2", 2)]


def test_progress_extends_the_claim(jobs: JobStore, clock: FakeClock) -> None:
    jobs.enqueue("r1", "eu-west")
    claim = jobs.claim("w1", 11, CLAIM_TTL_S)
    assert claim is not None
    clock.now += CLAIM_TTL_S - 0.1

    assert jobs.progress(claim, CLAIM_TTL_S, phase="leased", epoch=3)

    clock.now += CLAIM_TTL_S - 0.1
    assert jobs.claim("w2", 12, CLAIM_TTL_S) is None


def test_a_stale_claim_records_its_attempt_but_never_touches_the_job(
    jobs: JobStore, clock: FakeClock
) -> None:
    job_id = jobs.enqueue("r1", "eu-west")
    stale = jobs.claim("w1", 11, CLAIM_TTL_S)
    assert stale is not None
    assert jobs.progress(stale, CLAIM_TTL_S, phase="writing", epoch=1, rule_read={"v": 1})
    clock.now += CLAIM_TTL_S + 1
    current = jobs.claim("w2", 12, CLAIM_TTL_S)
    assert current is not None
    assert jobs.progress(current, CLAIM_TTL_S, phase="writing", epoch=2, rule_read={"v": 2})

    # While the successor is still at work...
    assert not jobs.progress(stale, CLAIM_TTL_S, phase="writing", rule_read={"v": "stale"})
    assert not jobs.finish(stale, Outcome("stale_epoch", PENDING, "superseded"))

    running = jobs.status(job_id)
    assert running is not None
    assert (running["state"], running["claimed_by"], running["result"]) == (RUNNING, "w2", None)
    assert running["rule_read"] == {"v": 2}
    clock.now += CLAIM_TTL_S - 0.1
    assert jobs.claim("w3", 13, CLAIM_TTL_S) is None  # the stale claim extended nothing
    # ...and after it finished.
    assert jobs.finish(current, Outcome("written", DONE, "version 2"))
    assert not jobs.finish(stale, Outcome("stale_epoch", PENDING, "superseded"))

    status = jobs.status(job_id)
    assert status is not None
    assert status["state"] == DONE
    assert status["result"] == {"outcome": "written", "detail": "version 2"}
    assert status["rule_read"] == {"v": 2}
    assert [(a["epoch"], a["outcome"]) for a in status["attempts"]] == [
        (1, "stale_epoch"),
        (2, "written"),
    ]


def test_a_finished_job_is_not_claimed_again(jobs: JobStore, clock: FakeClock) -> None:
    jobs.enqueue("r1", "eu-west")
    claim = jobs.claim("w1", 11, CLAIM_TTL_S)
    assert claim is not None
    assert jobs.finish(claim, Outcome("outcome_unknown", BLOCKED, "effect e1 in doubt"))

    clock.now += CLAIM_TTL_S + 1

    assert jobs.claim("w2", 12, CLAIM_TTL_S) is None
    assert not jobs.has_lapsed_claim("w1")  # it finished: nothing to replace it for


def test_a_retried_outcome_makes_the_job_pending_again_after_a_pause(
    jobs: JobStore, clock: FakeClock
) -> None:
    job_id = jobs.enqueue("r1", "eu-west")
    claim = jobs.claim("w1", 11, CLAIM_TTL_S)
    assert claim is not None
    assert jobs.finish(claim, Outcome("lease_held", PENDING, "held by w9"))

    clock.now += RETRY_DELAY_S - 0.1
    assert jobs.claim("w2", 12, CLAIM_TTL_S) is None
    clock.now += 0.1
    again = jobs.claim("w2", 12, CLAIM_TTL_S)

    assert again is not None
    assert (again.job_id, again.generation) == (job_id, 2)


def test_a_gone_worker_closes_only_its_own_open_attempts(jobs: JobStore, clock: FakeClock) -> None:
    job_id = jobs.enqueue("r1", "eu-west")
    dead = jobs.claim("w1", 11, CLAIM_TTL_S)
    assert dead is not None
    clock.now += CLAIM_TTL_S + 1
    alive = jobs.claim("w2", 12, CLAIM_TTL_S)
    assert alive is not None

    jobs.worker_gone("w1", 11, "worker exited (killed by SIGKILL)")
    jobs.worker_gone("w1", 11, "worker exited (status 0)")

    status = jobs.status(job_id)
    assert status is not None
    assert [(a["outcome"], a["detail"]) for a in status["attempts"]] == [
        ("worker_exited", "worker exited (killed by SIGKILL)"),
        (None, None),
    ]


def test_a_gone_workers_claim_is_given_back_at_once(jobs: JobStore, clock: FakeClock) -> None:
    job_id = jobs.enqueue("r1", "eu-west")
    assert jobs.claim("w1", 11, CLAIM_TTL_S) is not None

    jobs.worker_gone("w1", 11, "worker exited (status 1)")

    status = jobs.status(job_id)
    assert status is not None
    assert (status["state"], status["claimed_by"]) == (PENDING, None)
    clock.now += RETRY_DELAY_S
    again = jobs.claim("w2", 12, CLAIM_TTL_S)  # long before the claim would have expired
    assert again is not None and again.generation == 2


def test_the_same_failure_n_times_in_a_row_fails_the_job_with_its_reason(
    jobs: JobStore, clock: FakeClock
) -> None:
    job_id = jobs.enqueue("r1", "eu-west")
    crash = Outcome("worker_error", PENDING, "KeyError: 'rule'")
    for attempt in range(1, MAX_SAME_FAILURES + 1):
        claim = jobs.claim(f"w{attempt}", attempt, CLAIM_TTL_S)
        assert claim is not None, attempt
        assert jobs.finish(claim, crash)
        clock.now += RETRY_DELAY_S
    status = jobs.status(job_id)
    assert status is not None
    assert status["state"] == FAILED
    assert status["result"] == {
        "outcome": "worker_error",
        "detail": f"KeyError: 'rule' ({MAX_SAME_FAILURES} attempts in a row ended so)",
    }
    assert jobs.claim("w9", 9, CLAIM_TTL_S) is None

    # Retried by hand, it gets N attempts again.
    assert jobs.retry(job_id) is None
    claim = jobs.claim("w10", 10, CLAIM_TTL_S)
    assert claim is not None
    assert jobs.finish(claim, crash)
    status = jobs.status(job_id)
    assert status is not None and status["state"] == PENDING


def test_different_failures_do_not_add_up(jobs: JobStore, clock: FakeClock) -> None:
    job_id = jobs.enqueue("r1", "eu-west")
    for attempt, detail in enumerate(["KeyError: 'rule'", "worker exited (status 1)"] * 2):
        claim = jobs.claim(f"w{attempt}", attempt, CLAIM_TTL_S)
        assert claim is not None
        jobs.finish(claim, Outcome("worker_error", PENDING, detail))
        clock.now += RETRY_DELAY_S
    status = jobs.status(job_id)
    assert status is not None and status["state"] == PENDING


def test_only_pending_or_blocked_jobs_are_cancelled(jobs: JobStore, clock: FakeClock) -> None:
    running = jobs.enqueue("r1", "eu-west")
    assert jobs.claim("w1", 11, CLAIM_TTL_S) is not None
    clock.now += 1
    pending = jobs.enqueue("r2", "eu-west")

    assert jobs.cancel(pending) is None
    refused = jobs.cancel(running)
    assert refused is not None and refused.startswith("the job is running")
    assert jobs.cancel(pending) == "the job is already cancelled"
    assert jobs.cancel("nope") == "no job 'nope'"
    status = jobs.status(pending)
    assert status is not None and status["state"] == CANCELLED
    assert jobs.claim("w2", 12, CLAIM_TTL_S) is None
    assert jobs.retry(running) == "the job is running: only a failed or cancelled job is retried"


@pytest.mark.parametrize(
    ("schedule", "says", "never_says"),
    [
        # The probe schedule could not be read: both ways are named.
        ({}, "settles it by probe if the route has one", "no probe scheduled"),
        # The route has no probe, or its probes gave up: only an operator settles it.
        ({"next_probe_at": None}, "no probe scheduled for it", "asks the upstream about it"),
        # A probe is due: its time, and that an operator may settle it sooner.
        (
            {"next_probe_at": 1_000_042.0},
            "asks the upstream about it at 13:47:22 UTC (its probe)",
            "no probe scheduled",
        ),
    ],
)
def test_a_blocked_result_says_how_its_write_will_be_settled(
    tmp_path: Path, clock: FakeClock, schedule: dict[str, float | None], says: str, never_says: str
) -> None:
    jobs = JobStore(tmp_path, clock, blocked_recheck_s=5.0)
    try:
        job_id = jobs.enqueue("r1", "eu-west")
        claim = jobs.claim("w1", 11, CLAIM_TTL_S)
        assert claim is not None
        blocked = Outcome("outcome_unknown", BLOCKED, "effect eff-1 in doubt", "eff-1", schedule)
        jobs.finish(claim, blocked)
        status = jobs.status(job_id)
        assert status is not None
        result = status["result"]
        assert {k: v for k, v in result.items() if k == "next_probe_at"} == schedule
        assert says in result["next"] and never_says not in result["next"], result["next"]
        assert "reconcile resolve eff-1" in result["next"]
        assert result["next"] == blocked_next_step("eff-1", clock.now + 5.0, result)
    finally:
        jobs.close()


def test_a_blocked_job_follows_its_settlement(tmp_path: Path, clock: FakeClock) -> None:
    jobs = JobStore(tmp_path, clock, blocked_recheck_s=5.0)
    try:
        job_id = jobs.enqueue("r1", "eu-west")
        claim = jobs.claim("w1", 11, CLAIM_TTL_S)
        assert claim is not None
        jobs.finish(claim, Outcome("outcome_unknown", BLOCKED, "effect eff-1 in doubt", "eff-1"))
        status = jobs.status(job_id)
        assert status is not None
        assert status["result"]["effect_id"] == "eff-1"
        assert "Nothing will be resent" in status["result"]["next"]
        assert "reconcile resolve eff-1" in status["result"]["next"]
        assert jobs.blocked_due() == []
        clock.now += 5.0
        (due,) = jobs.blocked_due()
        assert (due.job_id, due.effect_id) == (job_id, "eff-1")

        assert jobs.follow_settlement(due, None)  # still in doubt: looked at again later
        assert jobs.blocked_due() == []
        assert jobs.follow_settlement(due, Outcome("not_committed", PENDING, "settled"))
        status = jobs.status(job_id)
        assert status is not None and status["state"] == PENDING
        assert not jobs.follow_settlement(due, Outcome("written", DONE, "settled"))
    finally:
        jobs.close()


def test_concurrent_claimers_each_get_a_different_job(tmp_path: Path) -> None:
    """Separate connections, as separate worker processes have: every claim is one
    transaction that takes the write lock first, so none fails and none doubles up."""
    setup = JobStore(tmp_path)
    job_ids = {setup.enqueue(f"r{n}", "eu-west") for n in range(40)}
    setup.close()
    claimed: list[str] = []
    failures: list[BaseException] = []

    def claim_all(worker: str) -> None:
        store = JobStore(tmp_path)
        try:
            while (claim := store.claim(worker, 1, 60.0)) is not None:
                claimed.append(claim.job_id)
        except BaseException as exc:  # reported below, not lost on the thread
            failures.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=claim_all, args=(f"w{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert failures == []
    assert sorted(claimed) == sorted(job_ids)
