"""/_fence/readyz writes a heartbeat, at most one per interval (proxy/readiness.py)."""

from __future__ import annotations

import asyncio

import pytest

from proxy.readiness import HEARTBEAT_INTERVAL_S, Readiness
from store import Replica, StoreError, StoreUnavailable


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Beats:
    """A store's heartbeat: counts the writes; fails with `failure` when set."""

    def __init__(self) -> None:
        self.writes = 0
        self.failure: StoreError | None = None

    async def heartbeat(self) -> float:
        self.writes += 1
        await asyncio.sleep(0)  # a real write suspends: concurrent probes overlap
        if self.failure is not None:
            raise self.failure
        return 0.0


async def test_one_heartbeat_per_interval_and_the_answer_is_cached_in_between() -> None:
    clock, beats = Clock(), Beats()
    readiness = Readiness(clock=clock)
    await readiness.check(beats)
    await asyncio.gather(*(readiness.check(beats) for _ in range(5)))
    assert beats.writes == 1
    clock.now += HEARTBEAT_INTERVAL_S
    await readiness.check(beats)
    assert beats.writes == 2


async def test_concurrent_probes_share_one_heartbeat() -> None:
    beats = Beats()
    readiness = Readiness(clock=Clock())
    await asyncio.gather(*(readiness.check(beats) for _ in range(5)))
    assert beats.writes == 1


@pytest.mark.parametrize(
    "failure", [StoreUnavailable("disk I/O error"), StoreError("read-only transaction")]
)
async def test_a_refused_write_is_not_ready_until_a_write_works_again(
    failure: StoreError,
) -> None:
    clock, beats = Clock(), Beats()
    readiness = Readiness(clock=clock)
    beats.failure = failure
    with pytest.raises(StoreUnavailable, match=str(failure)):
        await readiness.check(beats)
    beats.failure = None
    # Still the cached answer within the interval...
    with pytest.raises(StoreUnavailable):
        await readiness.check(beats)
    assert beats.writes == 1
    # ...and ready once a heartbeat succeeds.
    clock.now += HEARTBEAT_INTERVAL_S
    await readiness.check(beats)
    assert beats.writes == 2


class Rows:
    """A store's replicas' rows: counts the reads."""

    def __init__(self) -> None:
        self.reads = 0

    async def replicas(self, within_s: float) -> tuple[Replica, ...]:
        self.reads += 1
        return (Replica("a", "1", 0.0, 1.0, None, None, f"digest-{self.reads}"),)


async def test_the_replicas_compared_in_readyz_are_read_once_per_interval() -> None:
    """Probes come often: the policy comparison costs one read per interval, not one
    per probe, and a reload elsewhere shows within the interval."""
    clock, rows = Clock(), Rows()
    readiness = Readiness(clock=clock)
    for _ in range(5):
        (seen,) = await readiness.replicas(rows, 300)
    assert (rows.reads, seen.policy_digest) == (1, "digest-1")
    clock.now += HEARTBEAT_INTERVAL_S
    (seen,) = await readiness.replicas(rows, 300)
    assert (rows.reads, seen.policy_digest) == (2, "digest-2")
