"""Each instance writes its row in `replicas` (the status page's service panel) from
the reconciler's loop, at most once per REPLICA_BEAT_INTERVAL_S, with its instants
as ages so that the store puts them on its own clock (reconcile/prober.py)."""

from __future__ import annotations

from typing import cast

import aiohttp

from policies import Policy
from reconcile.prober import REPLICA_BEAT_INTERVAL_S, Reconciler
from store import Store


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Rows:
    """A store's `record_replica`: keeps what each write was given."""

    def __init__(self) -> None:
        self.written: list[tuple[str, float, float | None, float | None]] = []
        self.digests: list[str | None] = []
        self.recovery_reads = 0

    async def refresh_recovery(self) -> None:
        self.recovery_reads += 1

    async def record_replica(
        self,
        version: str,
        up_s: float,
        sweep_age_s: float | None,
        probe_age_s: float | None,
        policy_digest: str | None = None,
    ) -> None:
        self.written.append((version, up_s, sweep_age_s, probe_age_s))
        self.digests.append(policy_digest)


def _reconciler(rows: Rows, clock: Clock) -> Reconciler:
    # beat() touches nothing but the store's record_replica and refresh_recovery.
    return Reconciler(
        cast(Store, rows),
        cast(aiohttp.ClientSession, None),
        cast(Policy, None),
        1.0,
        version="1.2.3",
        started=clock.now - 30.0,
        clock=clock,
    )


async def test_one_row_write_per_interval_whatever_the_rounds() -> None:
    rows, clock = Rows(), Clock()
    reconciler = _reconciler(rows, clock)
    await reconciler.beat()
    for _ in range(10):  # the loop's rounds come every 0.2 s
        clock.now += REPLICA_BEAT_INTERVAL_S / 20
        await reconciler.beat()
    assert len(rows.written) == 1
    clock.now += REPLICA_BEAT_INTERVAL_S / 2
    await reconciler.beat()
    assert len(rows.written) == 2


async def test_the_row_carries_uptime_and_the_ages_of_the_last_sweep_and_probe() -> None:
    rows, clock = Rows(), Clock()
    reconciler = _reconciler(rows, clock)
    await reconciler.beat()
    assert rows.written == [("1.2.3", 30.0, None, None)]
    reconciler.last_sweep = clock.now - 0.5
    reconciler.last_probe = clock.now - 4.0
    clock.now += REPLICA_BEAT_INTERVAL_S
    await reconciler.beat()
    assert rows.written[-1] == ("1.2.3", 30.0 + REPLICA_BEAT_INTERVAL_S, 5.5, 9.0)


async def test_the_row_says_which_policy_and_a_reload_says_the_new_one_at_once() -> None:
    """A reload sets the digest and forgets the last beat (proxy/reloading.py): the
    row says the new policy at the next round, not an interval later."""
    rows, clock = Rows(), Clock()
    reconciler = _reconciler(rows, clock)
    reconciler.policy_digest = "a" * 64
    await reconciler.beat()
    reconciler.policy_digest, reconciler.last_beat = "b" * 64, None
    clock.now += REPLICA_BEAT_INTERVAL_S / 20
    await reconciler.beat()
    assert rows.digests == ["a" * 64, "b" * 64]


async def test_each_beat_reads_the_recovery_window_again() -> None:
    """An operator may close it through another replica: this one stops refusing
    unknown keys within a beat."""
    rows, clock = Rows(), Clock()
    reconciler = _reconciler(rows, clock)
    await reconciler.beat()
    clock.now += REPLICA_BEAT_INTERVAL_S / 2
    await reconciler.beat()
    assert rows.recovery_reads == 1
    clock.now += REPLICA_BEAT_INTERVAL_S
    await reconciler.beat()
    assert rows.recovery_reads == 2
