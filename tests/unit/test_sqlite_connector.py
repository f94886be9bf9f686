"""The SQLite connector on aiosqlite (store/sqlite.py): operations that queued together
run as one transaction, in one call into the connection's thread; whatever an operation
raises (BaseException too) is its own caller's answer and rolls the transaction back, so
the file's write lock is never kept, and closing the store answers every call still
queued. Every wait is bounded, so that a
hang fails its test instead of the suite's timeout."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from store.base import Operation, StoreUnavailable, Tx
from store.operation_queue import MAX_BATCH, OperationQueue, Outcome
from store.schema import open_current
from store.sqlite import OperationSuspended, SQLiteConnector

WAIT_S = 10.0


class Interrupted(BaseException):
    """Not an Exception: what an `except Exception` lets through."""


@contextlib.asynccontextmanager
async def open_connector(path: Path) -> AsyncIterator[SQLiteConnector]:
    connector = SQLiteConnector(f"sqlite:///{path}", lambda: 1000.0)
    await asyncio.wait_for(open_current(connector), WAIT_S)
    try:
        yield connector
    finally:
        await asyncio.wait_for(connector.close(), WAIT_S)


def set_epoch(resource: str, epoch: int) -> Operation[int]:
    async def operation(tx: Tx) -> int:
        return await tx.execute("set_resource_epoch", resource=resource, epoch=epoch)

    return operation


def writes_then_raises(error: BaseException) -> Operation[None]:
    async def operation(tx: Tx) -> None:
        await tx.execute("set_resource_epoch", resource="doomed", epoch=7)
        raise error

    return operation


def epoch_of(path: Path, resource: str) -> int | None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        row = conn.execute("SELECT epoch FROM resources WHERE resource = ?", (resource,))
        found = row.fetchone()
    return None if found is None else int(found[0])


def write_from_another_connection(path: Path, resource: str) -> None:
    """Fails at once ("database is locked") while anyone holds the file's write lock."""
    with contextlib.closing(sqlite3.connect(path, timeout=0, isolation_level=None)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO resources (resource, epoch) VALUES (?, 1)", (resource,))
        conn.execute("COMMIT")


@pytest.mark.parametrize(
    "error", [LookupError("an operation's bug"), Interrupted("not an Exception")]
)
async def test_a_failed_transaction_is_rolled_back_and_releases_the_write_lock(
    tmp_path: Path, error: BaseException
) -> None:
    path = tmp_path / "fence.db"
    async with open_connector(path) as connector:
        with pytest.raises(type(error)) as raised:
            await asyncio.wait_for(connector.write(writes_then_raises(error)), WAIT_S)
        assert raised.value is error
        assert epoch_of(path, "doomed") is None
        write_from_another_connection(path, "elsewhere")
        assert await asyncio.wait_for(connector.write(set_epoch("after", 2)), WAIT_S) == 1
    assert (epoch_of(path, "elsewhere"), epoch_of(path, "after")) == (1, 2)


async def test_a_base_exception_is_only_its_own_callers_answer(tmp_path: Path) -> None:
    path = tmp_path / "fence.db"
    async with open_connector(path) as connector:
        # Queued together, so they share a batch: the failure takes the batch's
        # transaction down, and the others are retried on their own.
        results = await asyncio.wait_for(
            asyncio.gather(
                connector.write(set_epoch("before", 1)),
                connector.write(writes_then_raises(Interrupted("mid-batch"))),
                connector.write(set_epoch("behind", 2)),
                return_exceptions=True,
            ),
            WAIT_S,
        )
        assert results[0] == results[2] == 1
        assert isinstance(results[1], Interrupted)
        assert await asyncio.wait_for(connector.write(set_epoch("later", 3)), WAIT_S) == 1
    assert [epoch_of(path, r) for r in ("before", "doomed", "behind", "later")] == [1, None, 2, 3]


async def test_closing_answers_the_calls_still_queued_and_refuses_new_ones_at_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "fence.db"
    connector = SQLiteConnector(f"sqlite:///{path}", lambda: 1000.0)
    await asyncio.wait_for(open_current(connector), WAIT_S)
    gate, holding = threading.Event(), threading.Event()

    async def held(tx: Tx) -> int:
        holding.set()
        gate.wait(WAIT_S)  # the writer's thread is busy with this while the others queue
        return await tx.execute("set_resource_epoch", resource="held", epoch=1)

    first = asyncio.ensure_future(connector.write(held))
    await asyncio.wait_for(asyncio.to_thread(holding.wait, WAIT_S), WAIT_S)
    queued = [asyncio.ensure_future(connector.write(set_epoch(f"r{i}", i))) for i in range(1, 6)]
    await asyncio.sleep(0)
    closing = asyncio.ensure_future(connector.close())
    await asyncio.sleep(0)
    with pytest.raises(StoreUnavailable, match="not open"):
        await asyncio.wait_for(connector.write(set_epoch("too-late", 1)), WAIT_S)
    gate.set()
    await asyncio.wait_for(closing, WAIT_S)
    assert await asyncio.wait_for(asyncio.gather(first, *queued), WAIT_S) == [1] * 6
    assert [epoch_of(path, f"r{i}") for i in range(1, 6)] == list(range(1, 6))
    with pytest.raises(StoreUnavailable, match="not open"):
        await asyncio.wait_for(connector.read(set_epoch("closed", 1)), WAIT_S)


async def suspends_at_once(tx: Tx) -> None:
    await tx.execute("set_resource_epoch", resource="suspended", epoch=1)
    await asyncio.sleep(0)  # yields to a loop that is not there


async def waits_on_the_loop(tx: Tx) -> None:
    await tx.execute("set_resource_epoch", resource="suspended", epoch=1)
    await asyncio.sleep(0.05)  # needs the running loop, which the thread has not


@pytest.mark.parametrize(
    ("operation", "error"),
    [(suspends_at_once, OperationSuspended), (waits_on_the_loop, RuntimeError)],
)
async def test_an_operation_that_suspends_fails_alone_and_is_rolled_back(
    tmp_path: Path, operation: Operation[None], error: type[BaseException]
) -> None:
    """A batch runs in one call into the connection's thread, so an operation cannot
    wait there for the loop: one that tries fails, its writes rolled back, and the rest
    of its batch goes on."""
    path = tmp_path / "fence.db"
    async with open_connector(path) as connector:
        results = await asyncio.wait_for(
            asyncio.gather(
                connector.write(set_epoch("before", 1)),
                connector.write(operation),
                connector.write(set_epoch("behind", 2)),
                return_exceptions=True,
            ),
            WAIT_S,
        )
        assert results[0] == results[2] == 1
        assert isinstance(results[1], error)
        write_from_another_connection(path, "elsewhere")
    assert [epoch_of(path, r) for r in ("before", "suspended", "behind")] == [1, None, 2]


async def test_a_batch_is_one_call_into_the_connections_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pins what the connector takes from aiosqlite beyond its public API: `_execute`
    runs a callable on the connection's thread, `_conn` is the sqlite3 connection."""
    calls: list[Any] = []
    original: Callable[..., Awaitable[Any]] = aiosqlite.Connection._execute

    async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(fn)
        return await original(self, fn, *args, **kwargs)

    threads: list[int] = []

    async def where(tx: Tx) -> int:
        threads.append(threading.get_ident())
        return await tx.execute("set_resource_epoch", resource=f"r{len(threads)}", epoch=1)

    async def noted(tx: Tx) -> str:
        threads.append(threading.get_ident())
        return "read"

    async with open_connector(tmp_path / "fence.db") as connector:
        monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
        writes = [connector.write(where) for _ in range(5)]
        assert await asyncio.wait_for(asyncio.gather(*writes), WAIT_S) == [1] * 5
        assert len(calls) == 1  # the five queued together: one batch, one call
        assert await asyncio.wait_for(connector.read(noted), WAIT_S) == "read"
        monkeypatch.undo()
    assert len(calls) == 2
    assert threading.get_ident() not in threads


async def test_driver_errors_reach_callers_as_store_unavailable(tmp_path: Path) -> None:
    async def unbound(tx: Tx) -> int:
        return await tx.execute("set_resource_epoch", resource="r")  # :epoch missing

    async with open_connector(tmp_path / "fence.db") as connector:
        with pytest.raises(StoreUnavailable, match="write failed"):
            await asyncio.wait_for(connector.write(unbound), WAIT_S)
        with pytest.raises(StoreUnavailable, match="read failed"):
            await asyncio.wait_for(connector.read(unbound), WAIT_S)
        assert await asyncio.wait_for(connector.pragma("no_such_pragma"), WAIT_S) is None


async def test_a_store_that_cannot_open_leaves_no_connection_thread(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    # Threads by identity: another test's thread that ends meanwhile is none of these.
    before = set(threading.enumerate())
    connector = SQLiteConnector(f"sqlite:///{tmp_path / 'file' / 'fence.db'}", lambda: 0.0)
    with pytest.raises(StoreUnavailable, match="cannot"):
        await asyncio.wait_for(connector.open(), WAIT_S)
    not_a_database = tmp_path / "junk.db"
    not_a_database.write_bytes(b"not SQLite" * 100)
    connector = SQLiteConnector(f"sqlite:///{not_a_database}", lambda: 0.0)
    with pytest.raises(StoreUnavailable, match="cannot open"):
        await asyncio.wait_for(connector.open(), WAIT_S)
    # aiosqlite's thread ends a moment after it answered the close.
    for _ in range(100):
        if not set(threading.enumerate()) - before:
            break
        await asyncio.sleep(0.01)
    assert not set(threading.enumerate()) - before


class BatchRecorder:
    """Answers each operation with its batch's number, and remembers the batches' sizes."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    async def __call__(self, operations: list[Operation[Any]]) -> list[Outcome]:
        self.sizes.append(len(operations))
        return [(True, len(self.sizes)) for _ in operations]


async def never_runs(tx: Tx) -> None:
    raise AssertionError("operations go to the batch runner")


async def test_operations_queued_together_run_as_batches_of_at_most_max_batch() -> None:
    batches = BatchRecorder()
    queue = OperationQueue("test", batches)
    queue.start()
    waiters = [queue.submit(never_runs) for _ in range(MAX_BATCH + 3)]
    results = await asyncio.wait_for(asyncio.gather(*waiters), WAIT_S)
    await asyncio.wait_for(queue.stop(), WAIT_S)
    assert batches.sizes == [MAX_BATCH, 3]
    assert results == [1] * MAX_BATCH + [2] * 3


async def test_a_batch_runner_that_raises_fails_its_batch_and_the_queue_goes_on() -> None:
    failures: list[BaseException] = [Interrupted("a bug in the runner"), LookupError("another")]

    async def broken_twice(operations: list[Operation[Any]]) -> list[Outcome]:
        if failures:
            raise failures.pop(0)
        return [(True, "ran") for _ in operations]

    queue = OperationQueue("test", broken_twice)
    queue.start()
    with pytest.raises(Interrupted, match="a bug in the runner"):
        await asyncio.wait_for(queue.submit(never_runs), WAIT_S)
    with pytest.raises(LookupError, match="another"):
        await asyncio.wait_for(queue.submit(never_runs), WAIT_S)
    answered: object = await asyncio.wait_for(queue.submit(never_runs), WAIT_S)
    assert answered == "ran"  # the runner's answer, whatever the operation returns
    await asyncio.wait_for(queue.stop(), WAIT_S)
    with pytest.raises(StoreUnavailable, match="not open"):
        queue.submit(never_runs)


async def test_a_queue_whose_task_is_cancelled_answers_every_waiter() -> None:
    """A loop shutting down with the store open cancels the queue's task."""
    started = asyncio.Event()

    async def stuck(operations: list[Operation[Any]]) -> list[Outcome]:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("never woken")

    queue = OperationQueue("test", stuck)
    queue.start()
    running = queue.submit(never_runs)
    await asyncio.wait_for(started.wait(), WAIT_S)
    queued = queue.submit(never_runs)
    serving = next(task for task in asyncio.all_tasks() if task.get_name() == "test-0")
    serving.cancel()
    for waiter in (running, queued):
        with pytest.raises(StoreUnavailable, match="the store closed"):
            await asyncio.wait_for(waiter, WAIT_S)
    with pytest.raises(StoreUnavailable, match="not open"):
        queue.submit(never_runs)
    await asyncio.wait_for(queue.stop(), WAIT_S)
