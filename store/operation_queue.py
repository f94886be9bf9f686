"""Group commit: write operations that queue while the store's connections are busy run
together, one transaction (and one durable commit) per batch, both backends'.

An `OperationQueue` hands what has queued to a few lanes, each a task that alone uses a
connection while it runs a batch (SQLite: one writer lane and one reader lane, on their
own connections; PostgreSQL: a few lanes, each on a pool connection for its batch). An
operation submitted while a lane is idle goes to it at once, alone (no waiting: a lone
caller's latency is the transaction's); those that arrive while every lane is busy go
together in the next batch a lane takes, in the order they were queued (so do those
that arrive before the lane woken for the first has started). How a batch runs
(one transaction, and each operation again alone if one failed) is the connector's.

The order a batch's writes run in. PostgreSQL runs them in the order of the resources
they lock (those whose caller names it, store/postgres.py `_lock_order`; the others
after them), so that two batches (two lanes, or two replicas) that lock resources A
and B take them in one order and neither waits for the other's second lock: crossed,
PostgreSQL broke the deadlock by failing one batch, whose writes then ran again one by
one. Writes to one resource keep the order they queued in. The order of writes to
different resources is not promised to anyone: every write of a batch was waiting when
the batch was taken and none is answered before its COMMIT, so they were concurrent,
and any order of them is one they could have met running alone. Each decides under
its own resource's lock: its lease and epoch, its idempotency keys (a key is the
resource's), its effects and their history. What differs with the order, and is no
promise: each write's time (it is judged when it runs, `clock_timestamp()`), the
history's event ids, and which of two acquires of one quota subject on different
resources counts the other's lease under `max_live_leases` (the one that runs first
finds the room, as it could have alone). Refusal tallies are counted after the
transaction and written by writes of their own. Locks taken after a write's resource
(a quota subject's) are not ordered: two batches crossed there still deadlock, and
end as before. SQLite has one writer and no row locks: its batches keep the queue's
order.

A caller that stops waiting (cancelled) before its batch is taken is left out of it; once
taken, its operation runs to its end with the others and its answer goes to the `left`
callback its caller gave, if any (else nowhere): a batch is not torn down for one caller,
whose operation may then have been kept. An admission's caller gives one (store/effects.py):
an admission kept while its request's handler was gone is an effect recorded in flight
that nobody will send, which the proxy settles NOT_SENT at once (proxy/fenced.py), as
after a lost COMMIT answer, rather than leave it for a sweep to find UNKNOWN. With
`wait_s`, a job that no lane took within that long is answered `StoreUnavailable` and
left out: it never ran (as a pool's acquire that timed out).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from store.base import Left, StoreUnavailable

MAX_BATCH = 256
Outcome = tuple[bool, Any]
J = TypeVar("J")
_Queued = tuple[J, asyncio.Future[Any], asyncio.TimerHandle | None, Left | None]
_Taken = tuple[J, asyncio.Future[Any], Left | None]


def being_cancelled(exc: BaseException) -> bool:
    """Whether `exc` is the running task's own cancellation (not an operation's error)."""
    task = asyncio.current_task()
    return isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling() > 0


class OperationQueue(Generic[J]):
    """Jobs (store operations, and what their connector needs to run them), run in the
    order they were queued by `lanes` tasks: whatever has queued when a lane is free (up
    to `max_batch`) goes to `run_batch` at once, and each outcome to its own waiter."""

    def __init__(
        self,
        name: str,
        run_batch: Callable[[list[J]], Awaitable[list[Outcome]]],
        max_batch: int = MAX_BATCH,
        lanes: int = 1,
        wait_s: float | None = None,
    ) -> None:
        self._name = name
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._lanes = lanes
        self._wait_s = wait_s
        self._jobs: collections.deque[_Queued[J]] = collections.deque()
        # One waiter per idle lane: a job wakes one lane, not all of them.
        self._idle: list[asyncio.Future[None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    @property
    def queued(self) -> int:
        """How many jobs wait for a lane now (they run in the next batch); those whose
        caller stopped waiting, or that were refused for waiting too long, are not."""
        return sum(1 for _, future, _, _ in self._jobs if not future.done())

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._serve(), name=f"{self._name}-{lane}")
            for lane in range(self._lanes)
        ]

    def submit(self, job: J, left: Left | None = None) -> asyncio.Future[Any]:
        """A job, queued now, to run in the next batch. `left` is told its outcome (ok,
        and its result or error) if its caller stops waiting once a lane took it: the
        job ran, or may have, and nobody else hears of it."""
        if not self._tasks or self._closed:
            raise StoreUnavailable("the store is not open")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        timer = None
        if self._wait_s is not None and not self._idle:  # no lane takes it at once
            timer = loop.call_later(self._wait_s, self._expire, future)
        self._jobs.append((job, future, timer, left))
        self._wake(1)
        return future

    def _expire(self, future: asyncio.Future[Any]) -> None:
        """A job no lane took in time: its caller hears so, and no lane takes it now."""
        if not future.done():
            future.set_exception(
                StoreUnavailable(f"no store connection was free in time ({self._wait_s} s)")
            )

    def _wake(self, lanes: int) -> None:
        while self._idle and lanes > 0:
            waiter = self._idle.pop()
            if not waiter.done():
                waiter.set_result(None)
                lanes -= 1

    async def stop(self) -> None:
        """Take no more jobs, run those queued, and end the lanes."""
        self._closed = True
        self._wake(self._lanes)
        if self._tasks:
            await asyncio.wait(self._tasks)  # their own cancellation is not this caller's

    async def _serve(self) -> None:
        try:
            while self._jobs or not self._closed:
                if not self._jobs:
                    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    self._idle.append(waiter)
                    try:
                        await waiter
                    finally:
                        if waiter in self._idle:
                            self._idle.remove(waiter)
                    continue
                await self._answer(self._next_batch())
        finally:
            # Cancelled (a loop shutting down with the store open): nobody waits in vain.
            self._closed = True
            gone = StoreUnavailable("the store closed before this ran")
            while self._jobs:
                _, future, timer, _ = self._jobs.popleft()
                if timer is not None:
                    timer.cancel()
                if not future.done():
                    future.set_exception(gone)

    def _next_batch(self) -> list[_Taken[J]]:
        """The queued jobs, up to a batch, but those whose caller stopped waiting (or was
        answered that none was free)."""
        batch: list[_Taken[J]] = []
        while self._jobs and len(batch) < self._max_batch:
            job, future, timer, left = self._jobs.popleft()
            if timer is not None:
                timer.cancel()
            if not future.done():
                batch.append((job, future, left))
        return batch

    async def _answer(self, batch: list[_Taken[J]]) -> None:
        if not batch:
            return
        try:
            outcomes = await self._run_batch([job for job, _, _ in batch])
        except BaseException as exc:  # a bug in the runner: its batch hears of it, not later ones
            if being_cancelled(exc):
                outcomes = [(False, StoreUnavailable("the store closed while this ran"))]
                outcomes *= len(batch)
                _resolve(batch, outcomes)
                raise
            outcomes = [(False, exc)] * len(batch)
        _resolve(batch, outcomes)


def _resolve(batch: list[_Taken[Any]], outcomes: list[Outcome]) -> None:
    for (_, future, left), (ok, value) in zip(batch, outcomes, strict=True):
        if future.done():  # its waiter was cancelled
            if left is not None:
                # The caller's code, not the queue's: whatever it raises goes to the
                # loop's exception handler, not to the rest of this batch's waiters.
                asyncio.get_running_loop().call_soon(left, ok, value)
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
