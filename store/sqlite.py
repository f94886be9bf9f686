"""SQLite backend through aiosqlite: WAL, synchronous=FULL, group commit.

Every admission and every receipt is a durable commit. Paying one fsync per
request would cap throughput at the disk's flush rate, so writes queue up and
one task runs whatever has queued in a single transaction: each operation
still sees the effects of the ones before it (they run one after another on
one connection), and none is acknowledged before the COMMIT that holds it
returned. If an operation fails, the batch is rolled back and its operations
are retried one transaction each, so one bad operation cannot take others down.

A database file deleted or replaced under an open connection is not an error to
SQLite: the connection keeps writing to the unlinked inode and every commit
"succeeds", then vanishes at the next start. So the connector records the files'
identity (device, inode) when it opens them and checks it again after every
write batch's COMMIT, before anyone is answered, and before every read.
One stat() per file per batch costs microseconds against a commit's fsync. A
mismatch is final: the store answers StoreUnavailable until the process restarts
(and a restart on a store it does not know is refused, see proxy/identity.py).

A whole batch runs in one hop to aiosqlite's connection thread: the store's
operations are coroutines that only await this module's transaction methods,
which never suspend, so the thread can drive them to completion itself. A hop
per statement (aiosqlite's public API) costs more than the statements do, and
aiosqlite has no public way to run a function of ours on its thread:
`on_connection_thread` is the one place that uses its private members for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import aiosqlite

from store.base import Operation, Row, StoreError, StoreUnavailable, T
from store.queries import load_migrations, load_queries

MAX_BATCH = 256
_SYNCHRONOUS_MODES = ("FULL", "NORMAL", "EXTRA")
Outcome = tuple[bool, Any]
A = TypeVar("A")
FileIdentity = tuple[int, int]
# Each named block as its statements: a block may hold several (no round trips here to
# save, but the same block on PostgreSQL is one statement); empty for a block this
# backend does not need.
Queries = dict[str, tuple[str, ...]]


def _file_identity(path: Path) -> FileIdentity | None:
    """(st_dev, st_ino) of `path`, or None if there is no such file."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


class SQLiteTx:
    """Statements on the connection thread; `async` only to share the Tx protocol."""

    def __init__(self, conn: sqlite3.Connection, queries: Queries, now: float) -> None:
        self._conn = conn
        self._queries = queries
        self.now = now

    def _cursor(self, query: str, params: dict[str, Any]) -> sqlite3.Cursor | None:
        """The block's statements run in order; the cursor of its last (None: empty)."""
        statements = self._queries[query]
        if not statements:  # a block this backend does not need (see lock_resource)
            return None
        for sql in statements[:-1]:
            self._conn.execute(sql, params)
        return self._conn.execute(statements[-1], params)

    async def one(self, query: str, **params: Any) -> Row | None:
        cursor = self._cursor(query, params)
        row = cursor.fetchone() if cursor is not None else None
        return dict(row) if row is not None else None

    async def all(self, query: str, **params: Any) -> list[Row]:
        cursor = self._cursor(query, params)
        return [dict(row) for row in cursor] if cursor is not None else []

    async def execute(self, query: str, **params: Any) -> int:
        cursor = self._cursor(query, params)
        return cursor.rowcount if cursor is not None else 0


async def on_connection_thread(
    conn: aiosqlite.Connection, function: Callable[[sqlite3.Connection, A], T], argument: A
) -> T:
    """`function(the sqlite3 connection, argument)`, run on the connection's own thread.

    aiosqlite (0.20-0.22, as pyproject bounds it) has no public API for this; it uses
    `Connection._execute` (queue a callable for the connection's thread, await its
    result) and `Connection._conn` (the sqlite3 connection that thread owns) itself.
    tests/unit/test_sqlite_connection_thread.py pins both, so an aiosqlite release
    that changes them fails a test rather than the store.
    """
    result: T = await conn._execute(function, conn._conn, argument)  # type: ignore[no-untyped-call]
    return result


def _resolve(futures: list[asyncio.Future[Any]], outcomes: list[Outcome]) -> None:
    for future, (ok, value) in zip(futures, outcomes, strict=True):
        if future.done():  # its waiter was cancelled
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


def _drive(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends, here and now."""
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("a store operation awaited something other than its transaction")


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
        self._queries: Queries = {
            name: block_statements(sql) for name, sql in load_queries("sqlite.sql").items()
        }
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._pending: asyncio.Queue[tuple[Operation[Any], asyncio.Future[Any]]] = asyncio.Queue()
        self._write_task: asyncio.Task[None] | None = None
        # The files opened (the database, and its -wal when there is one) and their
        # identity then; set once a check finds one deleted or replaced, for good.
        self._files: dict[Path, FileIdentity] = {}
        self.lost: str | None = None

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None)
        conn.row_factory = sqlite3.Row
        await conn.execute("PRAGMA busy_timeout = 10000")
        await conn.execute("PRAGMA foreign_keys = ON")
        # The working set (leases, recent effects, keys) stays in memory: 64 MiB.
        await conn.execute("PRAGMA cache_size = -65536")
        return conn

    async def open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot create {self.path.parent}: {exc}") from exc
        try:
            self._writer = await self._connect()
            await self._writer.execute("PRAGMA journal_mode = WAL")
            await self._writer.execute(f"PRAGMA synchronous = {self.synchronous}")
            await self._migrate(self._writer)
            self._reader = await self._connect()
            await self._reader.execute("PRAGMA query_only = ON")
            # A read opens (or creates) the -wal file, so that both exist from here on.
            await self._reader.execute_fetchall("SELECT count(*) FROM schema_migrations")
        except sqlite3.Error as exc:
            await self.close()
            raise StoreUnavailable(f"cannot open {self.path}: {exc}") from exc
        self.lost = None
        self._files = {}
        for path in (self.path, self.path.with_name(f"{self.path.name}-wal")):
            identity = _file_identity(path)
            if identity is not None:
                self._files[path] = identity
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

    def _check_files(self) -> str | None:
        """Why the files are no longer the ones opened, or None; once found, for good."""
        if self.lost is None:
            for path, opened in self._files.items():
                now = _file_identity(path)
                if now != opened:
                    what = "deleted" if now is None else "replaced by another file"
                    self.lost = (
                        f"{path} was {what} while the proxy had it open: nothing written "
                        "since is kept, so nothing more is acknowledged (restart the proxy)"
                    )
                    break
        return self.lost

    async def write(self, operation: Operation[T], own_clock: bool = False) -> T:
        # own_clock: this backend's clock is the connector's anyway.
        if self._write_task is None or self._write_task.done():
            raise StoreUnavailable("the store is not open")
        if self.lost is not None:
            raise StoreUnavailable(self.lost)
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.put_nowait((operation, future))
        return await future

    async def statement(self, query: str, **params: Any) -> Row | None:
        """A block as a transaction of its own: nothing to save here, where a
        transaction costs no round trip, so every such block is empty (see receipt)."""
        if self._queries[query]:
            raise StoreError(f"{query} is a block of several steps on SQLite")
        return None

    async def read(self, operation: Operation[T]) -> T:
        if self._reader is None:
            raise StoreUnavailable("the store is not open")
        ok, value = await on_connection_thread(self._reader, self._read_in_thread, operation)
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    def _read_in_thread(self, conn: sqlite3.Connection, operation: Operation[Any]) -> Outcome:
        # A read of a deleted file would answer from records that are gone for good.
        lost = self._check_files()
        if lost is not None:
            return False, StoreUnavailable(lost)
        try:
            conn.execute("BEGIN")
            try:
                return True, _drive(operation(SQLiteTx(conn, self._queries, self._clock())))
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            return False, StoreUnavailable(f"read failed: {exc}")

    async def _write_loop(self) -> None:
        assert self._writer is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._pending.get()]
            while len(batch) < MAX_BATCH and not self._pending.empty():
                batch.append(self._pending.get_nowait())
            await on_connection_thread(self._writer, self._write_in_thread, (batch, loop))

    def _write_in_thread(
        self,
        conn: sqlite3.Connection,
        work: tuple[list[tuple[Operation[Any], asyncio.Future[Any]]], asyncio.AbstractEventLoop],
    ) -> None:
        batch, loop = work
        operations = [operation for operation, _ in batch]
        # Already lost: nothing more goes into the old file.
        lost = self.lost
        if lost is None:
            outcomes = self._transaction(conn, operations)
            if len(operations) > 1 and not all(ok for ok, _ in outcomes):
                # One failed and took the batch down with it: each again, on its own.
                outcomes = [self._transaction(conn, [operation])[0] for operation in operations]
            # After COMMIT, before anyone is answered: a file deleted before or while
            # the batch ran took the batch along.
            lost = self._check_files()
        if lost is not None:
            outcomes = [(False, StoreUnavailable(lost))] * len(operations)
        # Waiters are woken straight from here, not after this batch's own completion
        # reaches the writer task: one event-loop turn less on every store trip.
        loop.call_soon_threadsafe(_resolve, [future for _, future in batch], outcomes)

    def _transaction(
        self, conn: sqlite3.Connection, operations: list[Operation[Any]]
    ) -> list[Outcome]:
        """Run operations in one transaction: all kept, or all failed and rolled back."""
        results: list[Outcome] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for operation in operations:
                results.append(
                    (True, _drive(operation(SQLiteTx(conn, self._queries, self._clock()))))
                )
            conn.execute("COMMIT")
        except Exception as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            error = (
                StoreUnavailable(f"write failed: {exc}") if isinstance(exc, sqlite3.Error) else exc
            )
            return [(False, error)] * len(operations)
        return results


def block_statements(sql: str) -> tuple[str, ...]:
    """A named block's statements, in order (none for an empty block)."""
    return tuple(_split_statements(sql if sql.endswith(";") else f"{sql};")) if sql else ()


def _split_statements(sql: str) -> list[str]:
    statements, current = [], ""
    for line in sql.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    return [statement for statement in statements if statement]
