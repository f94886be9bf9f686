"""The SQLite store's connection threads (store/sqlite.py's ConnectionThread): one thread
alone uses its connection, jobs run in the order they were queued, operations that
queued together run as one batch, and every outcome reaches its own waiter."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from store.base import Operation, StoreUnavailable, Tx
from store.sqlite import MAX_BATCH, ConnectionThread, Outcome


def connect_to(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
    return conn


def insert_and_count(conn: sqlite3.Connection, value: int) -> tuple[int, int]:
    # sqlite3 refuses a connection used off the thread that created it
    # (check_same_thread), so this only works on the connection's own thread.
    conn.execute("INSERT INTO t VALUES (?)", (value,))
    (count,) = conn.execute("SELECT count(*) FROM t").fetchone()
    return count, threading.get_ident()


def fail(conn: sqlite3.Connection, message: str) -> None:
    raise LookupError(message)


class BatchRecorder:
    """Runs each operation's label as a row insert and remembers the batches' sizes."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, conn: sqlite3.Connection, operations: list[Operation[Any]]) -> list[Outcome]:
        self.sizes.append(len(operations))
        return [(True, len(self.sizes)) for _ in operations]


async def never_runs(tx: Tx) -> None:
    raise AssertionError("operations go to the batch runner")


async def test_calls_run_on_the_thread_in_order(tmp_path: Path) -> None:
    thread = ConnectionThread("t", lambda: connect_to(tmp_path / "t.db"), BatchRecorder())
    await thread.start()
    try:
        first, second = await asyncio.gather(
            thread.call(insert_and_count, 1), thread.call(insert_and_count, 2)
        )
        assert (first[0], second[0]) == (1, 2)
        assert first[1] == second[1] != threading.get_ident()
    finally:
        await thread.stop()


async def test_an_exception_on_the_thread_reaches_its_caller_only(tmp_path: Path) -> None:
    thread = ConnectionThread("t", lambda: connect_to(tmp_path / "t.db"), BatchRecorder())
    await thread.start()
    try:
        failed, counted = await asyncio.gather(
            thread.call(fail, "raised on the thread"),
            thread.call(insert_and_count, 1),
            return_exceptions=True,
        )
        assert isinstance(failed, LookupError) and str(failed) == "raised on the thread"
        assert isinstance(counted, tuple) and counted[0] == 1
    finally:
        await thread.stop()


async def test_operations_queued_together_run_as_batches_of_at_most_max_batch(
    tmp_path: Path,
) -> None:
    batches = BatchRecorder()
    thread = ConnectionThread("t", lambda: connect_to(tmp_path / "t.db"), batches)
    await thread.start()
    try:
        # The thread is held busy, so that everything below queues behind the call.
        gate = threading.Event()
        blocked = thread.call(lambda conn, _: gate.wait(10), None)
        waiters = [thread.submit(never_runs) for _ in range(MAX_BATCH + 3)]
        after = thread.call(insert_and_count, 1)
        gate.set()
        assert await blocked is True
        results = await asyncio.gather(*waiters)
        assert batches.sizes == [MAX_BATCH, 3]
        assert results == [1] * MAX_BATCH + [2] * 3
        assert (await after)[0] == 1  # queued after the operations, run after them
    finally:
        await thread.stop()


async def test_a_batch_runner_that_raises_fails_its_batch_and_the_thread_goes_on(
    tmp_path: Path,
) -> None:
    def broken(conn: sqlite3.Connection, operations: list[Operation[Any]]) -> list[Outcome]:
        raise LookupError("a bug in the batch runner")

    thread = ConnectionThread("t", lambda: connect_to(tmp_path / "t.db"), broken)
    await thread.start()
    try:
        with pytest.raises(LookupError, match="a bug in the batch runner"):
            await thread.submit(never_runs)
        assert (await thread.call(insert_and_count, 1))[0] == 1
    finally:
        await thread.stop()


async def test_a_connection_that_cannot_open_fails_start_and_stop_still_ends(
    tmp_path: Path,
) -> None:
    def cannot_open() -> sqlite3.Connection:
        raise sqlite3.OperationalError("unable to open database file")

    thread = ConnectionThread("t", cannot_open, BatchRecorder())
    with pytest.raises(sqlite3.OperationalError, match="unable to open"):
        await thread.start()
    await thread.stop()
    with pytest.raises(StoreUnavailable, match="not open"):
        await thread.submit(never_runs)
