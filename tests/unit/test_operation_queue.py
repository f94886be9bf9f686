"""The lanes of an `OperationQueue` (store/operation_queue.py): a job finds an idle lane at
once, those that arrive while every lane is busy go together in the next batch, and one
no lane took within `wait_s` is refused without running."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from store.base import StoreUnavailable
from store.operation_queue import OperationQueue, Outcome

WAIT_S = 5.0


class Lanes:
    """A batch runner whose batches wait for `go` when a job says "wait"; it records
    each batch's jobs."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.go = asyncio.Event()
        self.waiting = asyncio.Event()
        self.batches_waiting = 0
        self._changed = asyncio.Condition()

    async def __call__(self, jobs: list[str]) -> list[Outcome]:
        self.batches.append(jobs)
        if "wait" in jobs:
            self.waiting.set()
            async with self._changed:
                self.batches_waiting += 1
                self._changed.notify_all()
            await self.go.wait()
        return [(True, job) for job in jobs]

    async def until_waiting(self, batches: int) -> None:
        """Until `batches` batches wait for `go` (each holding its lane)."""
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: self.batches_waiting == batches), WAIT_S
            )


async def test_a_job_runs_at_once_on_an_idle_lane_while_another_lane_is_busy() -> None:
    lanes = Lanes()
    queue: OperationQueue[str] = OperationQueue("test", lanes, lanes=2)
    queue.start()
    busy = queue.submit("wait")
    await asyncio.wait_for(lanes.waiting.wait(), WAIT_S)
    assert await asyncio.wait_for(queue.submit("alone"), WAIT_S) == "alone"
    lanes.go.set()
    await asyncio.wait_for(busy, WAIT_S)
    await asyncio.wait_for(queue.stop(), WAIT_S)
    assert lanes.batches == [["wait"], ["alone"]]


async def test_jobs_that_arrive_while_every_lane_is_busy_run_as_one_batch() -> None:
    lanes = Lanes()
    queue: OperationQueue[str] = OperationQueue("test", lanes, lanes=2)
    queue.start()
    busy = [queue.submit("wait")]
    await asyncio.wait_for(lanes.waiting.wait(), WAIT_S)
    busy.append(queue.submit("wait"))  # the other lane's
    await lanes.until_waiting(2)
    queued = [queue.submit(name) for name in ("a", "b", "c")]
    assert queue.queued == 3
    lanes.go.set()
    assert await asyncio.wait_for(asyncio.gather(*queued), WAIT_S) == ["a", "b", "c"]
    await asyncio.wait_for(asyncio.gather(*busy), WAIT_S)
    await asyncio.wait_for(queue.stop(), WAIT_S)
    assert lanes.batches == [["wait"], ["wait"], ["a", "b", "c"]]


async def test_a_job_no_lane_took_in_time_is_refused_and_never_runs() -> None:
    lanes = Lanes()
    queue: OperationQueue[str] = OperationQueue("test", lanes, lanes=1, wait_s=0.1)
    queue.start()
    busy = queue.submit("wait")
    await asyncio.wait_for(lanes.waiting.wait(), WAIT_S)
    late = queue.submit("late")
    with pytest.raises(StoreUnavailable, match="no store connection was free in time"):
        await asyncio.wait_for(late, WAIT_S)
    lanes.go.set()
    assert await asyncio.wait_for(busy, WAIT_S) == "wait"
    # Taken by an idle lane: no time limit once it runs.
    lanes.go.clear()
    lanes.waiting.clear()
    slow = queue.submit("wait")
    await asyncio.wait_for(lanes.waiting.wait(), WAIT_S)
    await asyncio.sleep(0.2)
    lanes.go.set()
    assert await asyncio.wait_for(slow, WAIT_S) == "wait"
    await asyncio.wait_for(queue.stop(), WAIT_S)
    assert lanes.batches == [["wait"], ["wait"]]


async def test_stopping_answers_what_was_queued_by_running_it() -> None:
    ran: list[Any] = []

    async def run(jobs: list[str]) -> list[Outcome]:
        ran.extend(jobs)
        return [(True, job) for job in jobs]

    queue: OperationQueue[str] = OperationQueue("test", run, lanes=3)
    queue.start()
    waiters = [queue.submit(str(n)) for n in range(5)]
    await asyncio.wait_for(queue.stop(), WAIT_S)
    assert [await waiter for waiter in waiters] == ["0", "1", "2", "3", "4"]
    assert sorted(ran) == ["0", "1", "2", "3", "4"]


async def test_the_jobs_queued_are_those_waiting_for_a_lane_whose_caller_still_waits() -> None:
    lanes = Lanes()
    queue: OperationQueue[str] = OperationQueue("test", lanes, lanes=1)
    queue.start()
    assert queue.queued == 0
    busy = queue.submit("wait")
    await lanes.until_waiting(1)
    assert queue.queued == 0  # taken by the lane
    left, kept = queue.submit("left"), queue.submit("kept")
    assert queue.queued == 2
    left.cancel()
    assert queue.queued == 1
    lanes.go.set()
    assert await asyncio.wait_for(kept, WAIT_S) == "kept"
    assert queue.queued == 0
    await asyncio.wait_for(busy, WAIT_S)
    await asyncio.wait_for(queue.stop(), WAIT_S)
    assert lanes.batches == [["wait"], ["kept"]]


async def test_a_job_whose_caller_left_once_it_was_taken_tells_its_outcome_to_left() -> None:
    """Taken, it runs with its batch and its outcome goes to `left`; left out before it
    was taken, it never runs and `left` hears nothing."""
    running = {"first": asyncio.Event(), "second": asyncio.Event()}
    go = {"first": asyncio.Event(), "second": asyncio.Event()}
    ran: list[list[str]] = []

    async def run(jobs: list[str]) -> list[Outcome]:
        ran.append(jobs)
        for name in running:
            if name in jobs:
                running[name].set()
                await go[name].wait()
        return [(True, job) for job in jobs]

    queue: OperationQueue[str] = OperationQueue("test", run, lanes=1)
    queue.start()
    told: list[tuple[str, bool, Any]] = []

    def left(name: str) -> Callable[[bool, Any], None]:
        return lambda ok, value: told.append((name, ok, value))

    first = queue.submit("first")
    await asyncio.wait_for(running["first"].wait(), WAIT_S)
    never_taken = queue.submit("never taken", left("never taken"))
    never_taken.cancel()
    second = queue.submit("second", left("second"))
    go["first"].set()
    await asyncio.wait_for(running["second"].wait(), WAIT_S)
    second.cancel()
    go["second"].set()
    assert await asyncio.wait_for(first, WAIT_S) == "first"
    await asyncio.wait_for(queue.stop(), WAIT_S)
    assert told == [("second", True, "second")]
    assert ran == [["first"], ["second"]]


async def test_a_left_callback_that_fails_does_not_keep_its_batch_from_being_answered() -> None:
    """`left` is its caller's code: an error there is its own (the loop's exception
    handler logs it), never the other waiters' nor the lane's."""
    running = {"first": asyncio.Event(), "gone": asyncio.Event()}
    go = {"first": asyncio.Event(), "gone": asyncio.Event()}

    async def run(jobs: list[str]) -> list[Outcome]:
        for name in running:
            if name in jobs:
                running[name].set()
                await go[name].wait()
        return [(True, job) for job in jobs]

    def fails(ok: bool, value: Any) -> None:
        raise RuntimeError("the caller's own bug")

    queue: OperationQueue[str] = OperationQueue("test", run, lanes=1)
    queue.start()
    first = queue.submit("first")
    await asyncio.wait_for(running["first"].wait(), WAIT_S)
    gone, kept = queue.submit("gone", fails), queue.submit("kept")
    go["first"].set()
    await asyncio.wait_for(running["gone"].wait(), WAIT_S)
    gone.cancel()
    go["gone"].set()
    assert await asyncio.wait_for(kept, WAIT_S) == "kept"
    assert await asyncio.wait_for(queue.submit("after"), WAIT_S) == "after"
    assert await first == "first"
    await asyncio.wait_for(queue.stop(), WAIT_S)
