"""SQLite backend: WAL, synchronous=FULL, group commit, a thread per connection.

Every admission and every receipt is a durable commit. Paying one fsync per
request would cap throughput at the disk's flush rate, so writes queue up and
the writer's thread runs whatever has queued in a single transaction: each operation
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

Each connection has a thread of its own that alone uses it (`ConnectionThread`).
The writer's thread takes what has queued itself, runs it as one batch and wakes
the waiters from there: the event loop neither forms batches nor hands them over,
so the next batch starts as soon as the last one committed. A whole batch runs on
that thread in one go: the store's operations are coroutines that only await this
module's transaction methods, which never suspend, so the thread drives them to
completion itself (`_drive`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from store.base import Operation, Row, StoreError, StoreUnavailable, T
from store.history import RecoveryWindow, Replication
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


class _Call:
    """A function for the connection's thread, run on its own."""

    __slots__ = ("argument", "function")

    def __init__(self, function: Callable[[sqlite3.Connection, Any], Any], argument: Any) -> None:
        self.function = function
        self.argument = argument


_Job = tuple[Operation[Any] | _Call, asyncio.Future[Any]]
# Runs a batch of operations on the connection, one outcome each.
BatchRunner = Callable[[sqlite3.Connection, list[Operation[Any]]], list[Outcome]]


class ConnectionThread:
    """One sqlite3 connection and the one thread that uses it.

    `call` runs a function on the thread. `submit` queues a store operation; the
    thread runs whatever operations have queued (up to MAX_BATCH) as one batch
    through `run_batch`, and resolves each waiter from the thread itself.
    """

    def __init__(
        self, name: str, connect: Callable[[], sqlite3.Connection], run_batch: BatchRunner
    ) -> None:
        self._connect = connect
        self._run_batch = run_batch
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._started = False
        self._closed = False

    async def start(self) -> None:
        """Start the thread and open its connection (errors reach the caller)."""
        self._thread.start()
        self._started = True
        await self.call(lambda conn, _: None, None)

    def call(
        self, function: Callable[[sqlite3.Connection, A], T], argument: A
    ) -> asyncio.Future[T]:
        """`function(connection, argument)` on the thread, queued now, in order."""
        return self._enqueue(_Call(function, argument))

    def submit(self, operation: Operation[T]) -> asyncio.Future[T]:
        """A store operation, queued now, to run in the next batch."""
        return self._enqueue(operation)

    def _enqueue(self, job: Operation[Any] | _Call) -> asyncio.Future[Any]:
        if not self._started or self._closed:
            raise StoreUnavailable("the store is not open")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._jobs.put((job, future))
        return future

    async def stop(self) -> None:
        """Let the thread finish what was queued, close the connection, and end."""
        if not self._started or self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        await asyncio.to_thread(self._thread.join)

    def _serve(self) -> None:
        conn: sqlite3.Connection | None = None
        failure: Exception | None = None
        try:
            conn = self._connect()
        except Exception as exc:  # answered to every job, the first being start()'s
            failure = exc
        held: collections.deque[_Job | None] = collections.deque()
        while True:
            job = held.popleft() if held else self._jobs.get()
            if job is None:
                break
            work, future = job
            if isinstance(work, _Call):
                futures, outcomes = [future], [_call(conn, work, failure)]
            else:
                batch = [job, *self._queued_operations(held)]
                futures = [future for _, future in batch]
                operations = [work for work, _ in batch if not isinstance(work, _Call)]
                outcomes = self._batch_outcomes(conn, failure, operations)
            _wake(futures, outcomes)
        if conn is not None:
            conn.close()

    def _batch_outcomes(
        self,
        conn: sqlite3.Connection | None,
        failure: Exception | None,
        operations: list[Operation[Any]],
    ) -> list[Outcome]:
        if conn is None:
            return [(False, failure)] * len(operations)
        try:
            return self._run_batch(conn, operations)
        except Exception as exc:  # a bug: its waiters hear of it, the thread goes on
            return [(False, exc)] * len(operations)

    def _queued_operations(self, held: collections.deque[_Job | None]) -> list[_Job]:
        """The operations queued now, up to a batch; the first other job is held back."""
        found: list[_Job] = []
        while len(found) < MAX_BATCH - 1:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is None or isinstance(job[0], _Call):
                held.append(job)
                break
            found.append(job)
        return found


def _call(conn: sqlite3.Connection | None, call: _Call, failure: Exception | None) -> Outcome:
    if conn is None:
        return False, failure
    try:
        return True, call.function(conn, call.argument)
    except Exception as exc:
        return False, exc


def _wake(futures: list[asyncio.Future[Any]], outcomes: list[Outcome]) -> None:
    """Resolve the waiters on their loop, from the connection's thread."""
    loop = futures[0].get_loop()
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
        loop.call_soon_threadsafe(_resolve, futures, outcomes)


class SQLiteConnector:
    def __init__(self, url: str, clock: Callable[[], float]) -> None:
        self.path, self.synchronous = parse_sqlite_url(url)
        self._clock = clock
        self._queries: Queries = {
            name: block_statements(sql) for name, sql in load_queries("sqlite.sql").items()
        }
        self._writer: ConnectionThread | None = None
        self._reader: ConnectionThread | None = None
        # The files opened (the database, and its -wal when there is one) and their
        # identity then; set once a check finds one deleted or replaced, for good.
        self._files: dict[Path, FileIdentity] = {}
        self.lost: str | None = None
        # Never opened by this backend, which has no standby; an operator may close one
        # left by a store copied from PostgreSQL's records (Store.refresh_recovery).
        self.recovery: RecoveryWindow | None = None
        self.replication: Replication | None = None

    def _connect(self, *pragmas: str) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.row_factory = sqlite3.Row
        for pragma in (
            "busy_timeout = 10000",
            "foreign_keys = ON",
            # The working set (leases, recent effects, keys) stays in memory: 64 MiB.
            "cache_size = -65536",
            *pragmas,
        ):
            conn.execute(f"PRAGMA {pragma}")
        return conn

    async def open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot create {self.path.parent}: {exc}") from exc
        self._writer = ConnectionThread(
            "sqlite-writer",
            lambda: self._connect("journal_mode = WAL", f"synchronous = {self.synchronous}"),
            self._write_batch,
        )
        self._reader = ConnectionThread(
            "sqlite-reader", lambda: self._connect("query_only = ON"), self._read_batch
        )
        try:
            await self._writer.start()
            await self._writer.call(self._migrate, None)
            await self._reader.start()
            # A read opens (or creates) the -wal file, so that both exist from here on.
            await self._reader.call(
                lambda conn, _: conn.execute("SELECT count(*) FROM schema_migrations").fetchall(),
                None,
            )
        except sqlite3.Error as exc:
            await self.close()
            raise StoreUnavailable(f"cannot open {self.path}: {exc}") from exc
        self.lost = None
        self._files = {}
        for path in (self.path, self.path.with_name(f"{self.path.name}-wal")):
            identity = _file_identity(path)
            if identity is not None:
                self._files[path] = identity

    async def close(self) -> None:
        for thread in (self._writer, self._reader):
            if thread is not None:
                await thread.stop()
        self._writer = self._reader = None

    async def pragma(self, name: str) -> Any:
        """The writer connection's setting `name` (journal_mode, synchronous, ...)."""
        if self._writer is None:
            raise StoreUnavailable("the store is not open")
        return await self._writer.call(
            lambda conn, _: conn.execute(f"PRAGMA {name}").fetchone()[0], None
        )

    def _migrate(self, conn: sqlite3.Connection, _: None) -> None:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        applied = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
        for version, name, sql in load_migrations("sqlite"):
            if version in applied:
                continue
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _split_statements(sql):
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)", (version, name, self._clock())
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
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
        if self._writer is None:
            raise StoreUnavailable("the store is not open")
        if self.lost is not None:
            raise StoreUnavailable(self.lost)
        return await self._writer.submit(operation)

    async def statement(self, query: str, **params: Any) -> Row | None:
        """A block as a transaction of its own: nothing to save here, where a
        transaction costs no round trip, so every such block is empty (see receipt)."""
        if self._queries[query]:
            raise StoreError(f"{query} is a block of several steps on SQLite")
        return None

    async def read(self, operation: Operation[T]) -> T:
        if self._reader is None:
            raise StoreUnavailable("the store is not open")
        return await self._reader.submit(operation)

    def _read_batch(
        self, conn: sqlite3.Connection, operations: list[Operation[Any]]
    ) -> list[Outcome]:
        """Reads that queued together, each in a snapshot of its own."""
        return [self._read(conn, operation) for operation in operations]

    def _read(self, conn: sqlite3.Connection, operation: Operation[Any]) -> Outcome:
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
        except Exception as exc:
            return False, exc

    def _write_batch(
        self, conn: sqlite3.Connection, operations: list[Operation[Any]]
    ) -> list[Outcome]:
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
            return [(False, StoreUnavailable(lost))] * len(operations)
        return outcomes

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
