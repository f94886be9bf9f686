"""SQLite backend: WAL, synchronous=FULL, group commit, on aiosqlite.

Every admission and every receipt is a durable commit. Paying one fsync per
request would cap throughput at the disk's flush rate, so writes queue up and
the writer runs whatever has queued in a single transaction: each operation
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

Each connection is an aiosqlite connection (the library runs it on a thread of its
own), and one task on the event loop alone hands it work (`OperationQueue`): callers
queue store operations; the writer's task runs whatever has queued as one transaction,
the reader's runs them one snapshot each. A whole batch, BEGIN to COMMIT, retries
included, is ONE call into the connection's thread, where the operations' statements run
on the plain sqlite3 connection: aiosqlite's per-statement hand-over (a future, a queue,
a wake-up each way, a cursor wrapped) cost more CPU than the statements themselves
(bench/README.md). So on SQLite an operation must not suspend: its coroutine is driven
in the thread, its Tx answers without suspending, and one that awaits anything else
fails with `OperationSuspended` (or asyncio's own "no running event loop"), its
transaction rolled back like any failure's. Whatever an operation raises, BaseException
included, rolls its transaction back and is its own caller's answer, and the task goes
on; closing the store answers what is still queued. bench/README.md has the
measurements that chose aiosqlite over the hand-written connection thread this module
had before.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import aiosqlite

from store.base import (
    CommitUnknown,
    Left,
    Operation,
    Row,
    SchemaOperation,
    StoreError,
    StoreUnavailable,
    T,
    Tx,
    Values,
)
from store.history import RecoveryWindow, Replication
from store.operation_queue import OperationQueue, Outcome
from store.queries import load_queries

_SYNCHRONOUS_MODES = ("FULL", "NORMAL", "EXTRA")
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


class OperationSuspended(RuntimeError):
    """An operation on SQLite awaited something other than its Tx's statements: a bug,
    since its transaction runs in one call into the connection's thread."""


class SQLiteTx:
    """One transaction's statements, run at once on the plain sqlite3 connection in the
    connection's thread: its methods are coroutines that never suspend."""

    def __init__(self, conn: sqlite3.Connection, queries: Queries, now: float) -> None:
        self._conn = conn
        self._queries = queries
        self.now = now

    def _all_but_last(self, query: str, params: dict[str, Any]) -> str | None:
        """Runs the block's statements but its last, and answers that (None: empty)."""
        statements = self._queries[query]
        if not statements:  # a block this backend does not need (see lock_resource)
            return None
        for sql in statements[:-1]:
            self._conn.execute(sql, params)
        return statements[-1]

    def guarded(self, query: str, params: dict[str, Any]) -> bool:
        """Runs the block's first statement, and the rest only if it changed a row:
        whether it did."""
        first, *rest = self._queries[query]
        if self._conn.execute(first, params).rowcount == 0:
            return False
        for sql in rest:
            self._conn.execute(sql, params)
        return True

    async def one(self, query: str, **params: Any) -> Row | None:
        rows = await self.all(query, **params)
        return rows[0] if rows else None

    async def values(self, query: str, **params: Any) -> Values | None:
        last = self._all_but_last(query, params)
        if last is None:
            return None
        found: Values | None = self._conn.execute(last, params).fetchone()
        return found

    async def all(self, query: str, **params: Any) -> list[Row]:
        last = self._all_but_last(query, params)
        if last is None:
            return []
        cursor = self._conn.execute(last, params)
        rows = cursor.fetchall()
        if not rows:
            return []
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in rows]

    async def execute(self, query: str, **params: Any) -> int:
        last = self._all_but_last(query, params)
        if last is None:
            return 0
        return self._conn.execute(last, params).rowcount

    async def script(self, sql: str) -> None:
        # Not executescript(), which commits the transaction first.
        for statement in _split_statements(sql):
            self._conn.execute(statement)


def _drive(operation: Operation[T], tx: SQLiteTx) -> T:
    """Runs `operation` to its end here and now, in the connection's thread."""
    coroutine = operation(tx)
    try:
        coroutine.send(None)
    except StopIteration as finished:
        result: T = finished.value
        return result
    coroutine.close()
    raise OperationSuspended(
        "an operation on SQLite awaited something other than its transaction's statements"
    )


def _translated(exc: BaseException, what: str) -> BaseException:
    """A driver's error as the store's; anything else as it was raised."""
    if isinstance(exc, sqlite3.Error):
        error = StoreUnavailable(f"{what} failed: {exc}")
        error.__cause__ = exc
        return error
    return exc


# A COMMIT refused for these left its transaction open, and the rollback ends it.
_COMMIT_REFUSED = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_CONSTRAINT})


def _commit_in_doubt(exc: BaseException) -> bool:
    """Whether a COMMIT that raised `exc` may have committed: one that failed writing
    the log (an I/O error, a full disk) may have left the whole transaction in it,
    which the next start replays."""
    if not isinstance(exc, sqlite3.Error):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    return code is None or code & 0xFF not in _COMMIT_REFUSED


def _roll_back(conn: sqlite3.Connection) -> None:
    """Ends whatever transaction is open (none: BEGIN itself failed, or COMMIT ended it)."""
    with contextlib.suppress(sqlite3.Error):
        conn.execute("ROLLBACK")


def _transaction(
    conn: sqlite3.Connection,
    queries: Queries,
    begin: str,
    jobs: list[tuple[Operation[Any], float]],
    what: str,
) -> list[Outcome]:
    """Runs operations in one transaction, in the connection's thread: all kept, or all
    failed and rolled back. Each job is an operation and the time it runs at."""
    results: list[Outcome] = []
    committing = False
    try:
        conn.execute(begin)
        for operation, now in jobs:
            results.append((True, _drive(operation, SQLiteTx(conn, queries, now))))
        committing = what == "write"
        conn.execute("COMMIT")
    except BaseException as exc:  # whatever it is, the file's lock is not kept
        _roll_back(conn)
        if committing and _commit_in_doubt(exc):
            error = CommitUnknown(f"the COMMIT failed ({exc}): it may have committed")
            error.__cause__ = exc
            return [(False, error)] * len(jobs)
        return [(False, _translated(exc, what))] * len(jobs)
    return results


def _write_batch_in_thread(
    conn: sqlite3.Connection, queries: Queries, jobs: list[tuple[Operation[Any], float]]
) -> list[Outcome]:
    """A write batch as one transaction; if one operation failed and took the batch down
    with it, each again in a transaction of its own (not when the COMMIT's fate is
    unknown: they may have committed already)."""
    outcomes = _transaction(conn, queries, "BEGIN IMMEDIATE", jobs, "write")
    if (
        len(jobs) > 1
        and not all(ok for ok, _ in outcomes)
        and not any(isinstance(value, CommitUnknown) for _, value in outcomes)
    ):
        outcomes = [
            _transaction(conn, queries, "BEGIN IMMEDIATE", [job], "write")[0] for job in jobs
        ]
    return outcomes


def _read_batch_in_thread(
    conn: sqlite3.Connection, queries: Queries, jobs: list[tuple[Operation[Any], float]]
) -> list[Outcome]:
    """Reads that queued together, each in a snapshot of its own."""
    return [_transaction(conn, queries, "BEGIN", [job], "read")[0] for job in jobs]


async def _in_thread(
    conn: aiosqlite.Connection,
    run: Callable[[sqlite3.Connection, Queries, list[tuple[Operation[Any], float]]], list[Outcome]],
    queries: Queries,
    jobs: list[tuple[Operation[Any], float]],
) -> list[Outcome]:
    """`run` over the plain sqlite3 connection, in aiosqlite's thread, as one call.
    aiosqlite's public API hands over one statement at a time; running a callable on
    its thread takes its private `_execute` and the sqlite3 connection its private
    `_conn` (aiosqlite >=0.20, <1; tests/unit/test_sqlite_connector.py pins both)."""
    call_in_thread: Callable[..., Awaitable[list[Outcome]]] = conn._execute
    return await call_in_thread(run, conn._conn, queries, jobs)


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
    backend = "sqlite"

    def __init__(self, url: str, clock: Callable[[], float]) -> None:
        self.path, self.synchronous = parse_sqlite_url(url)
        self._clock = clock
        self.instance_id: str | None = None
        self._queries: Queries = {
            name: block_statements(sql) for name, sql in load_queries("sqlite.sql").items()
        }
        self._connections: list[aiosqlite.Connection] = []
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._writes: OperationQueue[Operation[Any]] | None = None
        self._reads: OperationQueue[Operation[Any]] | None = None
        # The files opened (the database, and its -wal when there is one) and their
        # identity then; set once a check finds one deleted or replaced, for good.
        self._files: dict[Path, FileIdentity] = {}
        self.lost: str | None = None
        # Never opened by this backend, which has no standby; an operator may close one
        # left by a store copied from PostgreSQL's records (Store.refresh_recovery).
        self.recovery: RecoveryWindow | None = None
        self.replication: Replication | None = None

    async def _connect(self, *pragmas: str) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None)
        self._connections.append(conn)  # closed by close(), whatever fails next
        for pragma in (
            "busy_timeout = 10000",
            "foreign_keys = ON",
            # The working set (leases, recent effects, keys) stays in memory: 64 MiB.
            "cache_size = -65536",
            *pragmas,
        ):
            await conn.execute(f"PRAGMA {pragma}")
        return conn

    @property
    def writes_queued(self) -> int:
        return self._writes.queued if self._writes is not None else 0

    async def open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot create {self.path.parent}: {exc}") from exc
        try:
            writer = await self._connect("journal_mode = WAL", f"synchronous = {self.synchronous}")
            reader = await self._connect("query_only = ON")
            # A read opens (or creates) the -wal file, so that both exist from here on.
            await reader.execute_fetchall("PRAGMA schema_version")
        except sqlite3.Error as exc:
            await self.close()
            raise StoreUnavailable(f"cannot open {self.path}: {exc}") from exc
        except BaseException:
            await self.close()
            raise
        self._writer, self._reader = writer, reader
        self._writes = OperationQueue("sqlite-writer", self._write_batch)
        self._reads = OperationQueue("sqlite-reader", self._read_batch)
        self._writes.start()
        self._reads.start()
        self.lost = None
        self._files = {}
        for path in (self.path, self.path.with_name(f"{self.path.name}-wal")):
            identity = _file_identity(path)
            if identity is not None:
                self._files[path] = identity

    async def close(self) -> None:
        """Runs what is queued, then closes the connections."""
        for queue in (self._writes, self._reads):
            if queue is not None:
                await queue.stop()
        self._writes = self._reads = None
        self._writer = self._reader = None
        failure: sqlite3.Error | None = None
        while self._connections:
            try:
                await self._connections.pop().close()
            except sqlite3.Error as exc:
                failure = failure or exc
        if failure is not None:
            raise StoreUnavailable(f"closing {self.path} failed: {failure}") from failure

    async def pragma(self, name: str) -> Any:
        """The writer connection's setting `name` (journal_mode, synchronous, ...)."""
        if self._writer is None:
            raise StoreUnavailable("the store is not open")
        try:
            rows = list(await self._writer.execute_fetchall(f"PRAGMA {name}"))
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"PRAGMA {name} failed: {exc}") from exc
        return rows[0][0] if rows else None  # an unknown pragma answers nothing

    async def change_schema(self, operation: SchemaOperation[T]) -> T:
        """A write transaction like any other (BEGIN IMMEDIATE serialises it with every
        writer), at the connector's clock: its statements, and its scripts, run in the
        writer's thread."""

        async def schema_operation(tx: Tx) -> T:
            assert isinstance(tx, SQLiteTx)  # this connector's
            return await operation(tx)

        return await self.write(schema_operation)

    async def ready(self) -> None:
        """Nothing to learn: the files' identity is checked on every batch, and there is
        no history to check."""

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

    async def write(
        self,
        operation: Operation[T],
        own_clock: bool = False,
        resource: str | None = None,
        left: Left | None = None,
    ) -> T:
        # own_clock: this backend's clock is the connector's anyway. resource: one
        # writer takes no row locks, so a batch's order is the queue's.
        if self._writes is None:
            raise StoreUnavailable("the store is not open")
        if self.lost is not None:
            raise StoreUnavailable(self.lost)
        return cast(T, await self._writes.submit(operation, left))

    async def statement(self, query: str, **params: Any) -> Values | None:
        """A block as a write transaction of its own, at the transaction's time (`now`):
        its first statement decides, the rest run only if it changed a row. Its row is
        PostgreSQL's receipt's (store_id, now, applied): no store id (the file's
        identity is checked instead, after the COMMIT), the time, and whether it was
        applied. None for an empty block."""
        if not self._queries[query]:
            return None

        async def operation(tx: Tx) -> Values:
            assert isinstance(tx, SQLiteTx)  # this connector's
            return None, tx.now, tx.guarded(query, {**params, "now": tx.now})

        return await self.write(operation)

    async def read(self, operation: Operation[T]) -> T:
        if self._reads is None:
            raise StoreUnavailable("the store is not open")
        return cast(T, await self._reads.submit(operation))

    async def _read_batch(self, operations: list[Operation[Any]]) -> list[Outcome]:
        """Reads that queued together, each in a snapshot of its own, in one call into
        the reader's thread."""
        # A read of a deleted file would answer from records that are gone for good.
        lost = self._check_files()
        if lost is not None:
            return [(False, StoreUnavailable(lost))] * len(operations)
        assert self._reader is not None  # the queue runs only while the store is open
        jobs = [(operation, self._clock()) for operation in operations]
        return await _in_thread(self._reader, _read_batch_in_thread, self._queries, jobs)

    async def _write_batch(self, operations: list[Operation[Any]]) -> list[Outcome]:
        assert self._writer is not None  # the queue runs only while the store is open
        # Already lost: nothing more goes into the old file.
        lost = self.lost
        if lost is None:
            # Each operation's time is read here, on the loop, where the clock is moved.
            jobs = [(operation, self._clock()) for operation in operations]
            outcomes = await _in_thread(self._writer, _write_batch_in_thread, self._queries, jobs)
            # After COMMIT, before anyone is answered: a file deleted before or while
            # the batch ran took the batch along.
            lost = self._check_files()
        if lost is not None:
            return [(False, StoreUnavailable(lost))] * len(operations)
        return outcomes


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
