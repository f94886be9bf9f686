"""Every background loop runs under proxy/periodic.py: a failed round never ends it, the
pause doubles per failed round in a row up to x16 and comes back to the interval after
one that succeeds, and only cancellation (or, for work done once, success) stops it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from proxy import periodic
from proxy.periodic import Periodic, pause_after
from store import StoreUnavailable


class Rounds:
    """A round that fails as scripted: "bug" (an unexpected error), "store" (the store
    does not answer) or "ok"; once the script is over, every round succeeds."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.ran = 0
        # Set by each round as it starts (the test clears it).
        self.started = asyncio.Event()

    async def __call__(self) -> None:
        self.ran += 1
        self.started.set()
        step = self.script.pop(0) if self.script else "ok"
        if step == "bug":
            raise RuntimeError("a bug in one round")
        if step == "store":
            raise StoreUnavailable("the database did not answer")


class Clock:
    """The loop's waits, on a clock of the test's: each pause is noted and passes at once,
    and the loop is cancelled at its `stop_after`-th pause."""

    def __init__(self, stop_after: int) -> None:
        self.pauses: list[float] = []
        self.now = 0.0
        self.stop_after = stop_after

    async def __call__(self, wake: asyncio.Event, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds
        if len(self.pauses) >= self.stop_after:
            raise asyncio.CancelledError


def loop(
    rounds: Rounds,
    clock: Clock,
    failures: list[str],
    wait_first: bool = False,
    until_done: bool = False,
) -> Periodic:
    return Periodic(
        periodic.RETENTION,
        rounds,
        10.0,
        failures.append,
        wait=clock,
        wait_first=wait_first,
        until_done=until_done,
    )


async def test_the_pause_doubles_per_failure_up_to_sixteen_times_then_resets() -> None:
    rounds = Rounds(["bug", "store", "bug", "bug", "bug", "bug", "ok", "bug", "ok"])
    clock, failures = Clock(stop_after=10), list[str]()
    with pytest.raises(asyncio.CancelledError):
        await loop(rounds, clock, failures).run()
    assert clock.pauses == [20.0, 40.0, 80.0, 160.0, 160.0, 160.0, 10.0, 20.0, 10.0, 10.0]
    # Only the unexpected failures are counted; the store's are expected (and /readyz says).
    assert failures == ["retention"] * 6
    assert rounds.ran == 10


async def test_a_failed_round_is_logged_with_the_loop_and_the_next_pause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, failures = Clock(stop_after=2), list[str]()
    with (
        caplog.at_level(logging.INFO, logger="fenceproxy.periodic"),
        pytest.raises(asyncio.CancelledError),
    ):
        await loop(Rounds(["store", "bug"]), clock, failures).run()
    warning, error = caplog.records
    assert (warning.levelname, warning.getMessage()) == (
        "WARNING",
        "retention: the store is unavailable (the database did not answer); next round in 20 s",
    )
    assert (error.levelname, error.getMessage()) == (
        "ERROR",
        "retention: round failed; next round in 40 s",
    )
    assert error.exc_info is not None and isinstance(error.exc_info[1], RuntimeError)


def test_the_backoff_rule() -> None:
    assert [pause_after(0.2, failures) for failures in range(7)] == [
        0.2,
        0.4,
        0.8,
        1.6,
        3.2,
        3.2,
        3.2,
    ]


async def test_work_done_once_stops_at_its_first_success_after_a_first_pause() -> None:
    rounds, clock, failures = Rounds(["bug", "store"]), Clock(stop_after=99), list[str]()
    await loop(rounds, clock, failures, wait_first=True, until_done=True).run()
    assert clock.pauses == [10.0, 20.0, 40.0]
    assert rounds.ran == 3
    assert failures == ["retention"]


async def test_cancellation_stops_the_loop_in_a_pause_and_in_a_round() -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    ran: list[str] = []

    async def slow_round() -> None:
        ran.append("round")
        started.set()
        await release.wait()

    # A real wait (no test clock): cancelled inside its round, the loop ends.
    task = asyncio.create_task(Periodic("reconciler", slow_round, 0.01, lambda _: None).run())
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ran == ["round"]

    # And inside a pause: a long interval, woken by nothing, cancelled at once.
    rounds = Rounds([])
    paused = Periodic("reconciler", rounds, 3600.0, lambda _: None)
    task = asyncio.create_task(paused.run())
    await asyncio.wait_for(rounds.started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rounds.ran == 1


async def test_wake_runs_a_round_at_once_and_a_stop_as_it_wakes_still_stops() -> None:
    """The app stops its loops by cancelling them, at any moment: one that comes just
    as the loop is woken (on Python 3.11 `asyncio.wait_for` swallowed it, and the stop
    hung for the loop's whole interval) ends the loop all the same."""
    rounds = Rounds([])
    woken = Periodic("reconciler", rounds, 3600.0, lambda _: None)
    task = asyncio.create_task(woken.run())
    for _ in range(3):
        await asyncio.wait_for(rounds.started.wait(), 5)
        rounds.started.clear()
        woken.wake.set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert rounds.ran >= 3


class Interrupted(BaseException):
    """As KeyboardInterrupt and SystemExit are: the process's own, not a round's."""


async def test_a_base_exception_that_is_no_error_ends_the_loop() -> None:
    async def interrupted() -> None:
        raise Interrupted

    failures: list[str] = []
    with pytest.raises(Interrupted):
        await Periodic("collector", interrupted, 1.0, failures.append, wait=Clock(99)).run()
    assert failures == []
