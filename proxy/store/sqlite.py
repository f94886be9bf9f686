"""SQLite backend through aiosqlite: WAL, synchronous=FULL, group commit.

Every admission and every receipt is a durable commit. Paying one fsync per
request would cap throughput at the disk's flush rate, so writes queue up and
one task runs whatever has queued in a single transaction: each operation
still sees the effects of the ones before it (they run one after another on
one connection), and none is acknowledged before the COMMIT that holds it
returned. If an operation fails, the batch is rolled back and its operations
are retried one transaction each, so one bad operation cannot take others down.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiosqlite

from proxy.store.base import Operation, Row, StoreError, StoreUnavailable, T
from proxy.store.queries import load_migrations, load_queries

MAX_BATCH = 256
_SYNCHRONOUS_MODES = ("FULL", "NORMAL", "EXTRA")


class SQLiteTx:
    def __init__(self, conn: aiosqlite.Connection, queries: dict[str, str], now: float) -> None:
        self._conn = conn
        self._queries = queries
        self.now = now

    async def one(self, query: str, **params: Any) -> Row | None:
        rows = await self.all(query, **params)
        return rows[0] if rows else None

    async def all(self, query: str, **params: Any) -> list[Row]:
        rows = await self._conn.execute_fetchall(self._queries[query], params)
        return [dict(row) for row in rows]

    async def execute(self, query: str, **params: Any) -> int:
        cursor = await self._conn.execute(self._queries[query], params)
        count = cursor.rowcount
        await cursor.close()
        return count


def parse_sqlite_url(url: str) -> tuple[Path, str]:
    """`sqlite:///relative/path.db`, `sqlite:////abs/path.db`; `?synchronous=NORMAL`."""
    parts = urlsplit(url)
    raw_path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not raw_path:
        raise StoreError(f"no database path in {url!r}")
    options = parse_qs(parts.query)
    synchronous = options.get("synchronous", ["FULL"])[0].upper()
    if synchronous not in _SYNCHRONOUS_MODES:
        raise StoreError(f"synchronous must be one of {', '.join(_SYNCHRONOUS_MODES)}")
    return Path(raw_path), synchronous


class SQLiteConnector:
    def __init__(self, url: str, clock: Callable[[], float]) -> None:
        self.path, self.synchronous = parse_sqlite_url(url)
        self._clock = clock
        self._queries = load_queries("sqlite.sql")
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._read_lock = asyncio.Lock()
        self._pending: asyncio.Queue[tuple[Operation[Any], asyncio.Future[Any]]] = asyncio.Queue()
        self._write_task: asyncio.Task[None] | None = None

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None)
        conn.row_factory = sqlite3.Row
        await conn.execute("PRAGMA busy_timeout = 10000")
        await conn.execute("PRAGMA foreign_keys = ON")
        return conn

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._writer = await self._connect()
            await self._writer.execute("PRAGMA journal_mode = WAL")
            await self._writer.execute(f"PRAGMA synchronous = {self.synchronous}")
            await self._migrate(self._writer)
            self._reader = await self._connect()
            await self._reader.execute("PRAGMA query_only = ON")
        except sqlite3.Error as exc:
            await self.close()
            raise StoreUnavailable(f"cannot open {self.path}: {exc}") from exc
        self._write_task = asyncio.create_task(self._write_loop(), name="sqlite-writer")

    async def close(self) -> None:
        if self._write_task is not None:
            self._write_task.cancel()
            await asyncio.gather(self._write_task, return_exceptions=True)
            self._write_task = None
        while not self._pending.empty():
            _, future = self._pending.get_nowait()
            if not future.done():
                future.set_exception(StoreUnavailable("the store is closing"))
        for conn in (self._writer, self._reader):
            if conn is not None:
                await conn.close()
        self._writer = self._reader = None

    async def _migrate(self, conn: aiosqlite.Connection) -> None:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        applied = {
            row[0] for row in await conn.execute_fetchall("SELECT version FROM schema_migrations")
        }
        for version, name, sql in load_migrations("sqlite"):
            if version in applied:
                continue
            await conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _split_statements(sql):
                    await conn.execute(statement)
                await conn.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)", (version, name, self._clock())
                )
                await conn.execute("COMMIT")
            except BaseException:
                await conn.execute("ROLLBACK")
                raise

    async def write(self, operation: Operation[T]) -> T:
        if self._write_task is None or self._write_task.done():
            raise StoreUnavailable("the store is not open")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.put_nowait((operation, future))
        return await future

    async def read(self, operation: Operation[T]) -> T:
        if self._reader is None:
            raise StoreUnavailable("the store is not open")
        async with self._read_lock:
            try:
                await self._reader.execute("BEGIN")
                try:
                    return await operation(SQLiteTx(self._reader, self._queries, self._clock()))
                finally:
                    await self._reader.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"read failed: {exc}") from exc

    async def _write_loop(self) -> None:
        while True:
            batch = [await self._pending.get()]
            while len(batch) < MAX_BATCH and not self._pending.empty():
                batch.append(self._pending.get_nowait())
            outcomes = await self._run_batch(batch)
            if outcomes is None:
                outcomes = [await self._run_alone(entry) for entry in batch]
            for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
                if future.done():
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

    async def _run_batch(
        self, batch: list[tuple[Operation[Any], asyncio.Future[Any]]]
    ) -> list[tuple[bool, Any]] | None:
        """All operations in one transaction; None if any failed (then nothing was kept)."""
        if len(batch) == 1:
            return [await self._run_alone(batch[0])]
        assert self._writer is not None
        try:
            await self._writer.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            return [(False, StoreUnavailable(f"cannot begin a write: {exc}"))] * len(batch)
        results: list[tuple[bool, Any]] = []
        try:
            for operation, _ in batch:
                results.append(
                    (True, await operation(SQLiteTx(self._writer, self._queries, self._clock())))
                )
            await self._writer.execute("COMMIT")
        except Exception:
            await self._rollback()
            return None
        return results

    async def _run_alone(
        self, entry: tuple[Operation[Any], asyncio.Future[Any]]
    ) -> tuple[bool, Any]:
        assert self._writer is not None
        operation, _ = entry
        try:
            await self._writer.execute("BEGIN IMMEDIATE")
            result = await operation(SQLiteTx(self._writer, self._queries, self._clock()))
            await self._writer.execute("COMMIT")
        except sqlite3.Error as exc:
            await self._rollback()
            return False, StoreUnavailable(f"write failed: {exc}")
        except Exception as exc:
            await self._rollback()
            return False, exc
        return True, result

    async def _rollback(self) -> None:
        assert self._writer is not None
        if self._writer.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                await self._writer.execute("ROLLBACK")


def _split_statements(sql: str) -> list[str]:
    statements, current = [], ""
    for line in sql.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    return [statement for statement in statements if statement]
