"""The SQLite store's one hop per batch relies on two private members of aiosqlite's
Connection (`_execute` and `_conn`, see store/sqlite.py's `on_connection_thread`). These tests
pin what the store needs of them, so an aiosqlite upgrade that changes them fails
here rather than in production."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import aiosqlite
import pytest

from store.sqlite import on_connection_thread


def insert_and_count(conn: sqlite3.Connection, value: int) -> tuple[int, int]:
    # sqlite3 refuses a connection used off the thread that created it
    # (check_same_thread), so this only works on aiosqlite's own thread.
    conn.execute("INSERT INTO t VALUES (?)", (value,))
    (count,) = conn.execute("SELECT count(*) FROM t").fetchone()
    return count, threading.get_ident()


def fail(conn: sqlite3.Connection, message: str) -> None:
    raise LookupError(message)


async def test_a_function_runs_on_the_connection_thread_in_order_with_public_calls(
    tmp_path: Path,
) -> None:
    async with aiosqlite.connect(tmp_path / "hop.db") as conn:
        await conn.execute("CREATE TABLE t (x INTEGER)")
        count, thread = await on_connection_thread(conn, insert_and_count, 1)
        assert count == 1
        assert thread != threading.get_ident()
        # Queued behind the hop, a public call sees what the hop wrote.
        assert [tuple(row) for row in await conn.execute_fetchall("SELECT x FROM t")] == [(1,)]
        assert (await on_connection_thread(conn, insert_and_count, 2))[1] == thread


async def test_an_exception_on_the_connection_thread_reaches_the_caller(tmp_path: Path) -> None:
    async with aiosqlite.connect(tmp_path / "hop.db") as conn:
        with pytest.raises(LookupError, match="raised on the thread"):
            await on_connection_thread(conn, fail, "raised on the thread")
