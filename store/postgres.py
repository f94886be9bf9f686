"""PostgreSQL backend through asyncpg, for several proxy replicas sharing one authority.

Each read is one transaction on a pooled connection. Writes go through lanes
(store/operation_queue.py, the SQLite connector's group commit): a write that finds a
lane idle runs at once, alone, one transaction; writes that arrive while every lane is
busy run together in the next batch a lane takes, one transaction (one BEGIN, one
COMMIT, one WAL flush) in the order of the resources they lock (store/operation_queue.py
says why that order is no promise broken), none answered before that COMMIT returned. If the
batch fails before its COMMIT (one write's error, a conflict, a deadlock with another
batch) it was rolled back and each write runs again alone, with its own retries; if the
COMMIT's answer is lost, each write's is (`CommitUnknown`). A caller that stops waiting
is left out of a batch not yet taken; once taken, its write runs with the others (its
outcome told to the `left` it gave, if any).

Decisions about a resource take its row lock first (the `lock_resource` query), so two
replicas never both grant a live lease or admit writes under different epochs. Time is
the database's (`clock_timestamp()` when an operation starts, or once it holds its lock),
so replicas with skewed clocks still agree on when a lease expires, and a write late in
a batch is judged when it runs, not when the batch began.

A fenced request run alone is five round trips: its admission is BEGIN, one call that
locks and reads (`own_clock`: it answers the time and the store id itself), one write,
COMMIT; its receipt one statement that is its own transaction (`statement`; in a batch,
one statement of the batch's transaction). Every round trip is counted
(store/round_trips.py) for the bench and tests.

This connector carries statements and transactions, and nothing of the store's own:
the schema is created or migrated by store/schema.py (through `change_schema`), and the
database's history is judged, and recovered from, by the store's `HistoryWatch`
(store/failover.py). The connector hands it what each new connection's server answers
and what every BEGIN and COMMIT message told, in the messages it sends anyway; a loss
is recovered, on the connection that found it, before the transaction runs.

Driver errors are translated here, by what store/sqlstate.py says they mean: nothing
above the store sees asyncpg. Every statement is a named query: postgres.sql (the
store's), postgres_history.sql (the history check's) and postgres_session.sql (this
connector's own: its clock, the server checks).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast

import asyncpg

from core import failpoints
from policies.model import StorePool
from store import history, sqlstate
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
from store.failover import HistoryWatch
from store.history import RecoveryWindow, Replication
from store.operation_queue import OperationQueue, Outcome, being_cancelled
from store.queries import load_queries
from store.round_trips import CountingConnection, RoundTrips

# Serialization failures and deadlocks mean "nothing happened, try again".
RETRIES = 3
# A migration rewrites whole tables: not bound by store_pool.command_timeout_s.
MIGRATION_TIMEOUT_S = 24 * 3600.0
# The most writes one transaction carries: a batch holds its resources' locks until its
# COMMIT, and a caller that arrived last waits for all before it.
MAX_BATCH = 64
QUERY_FILES = ("postgres.sql", "postgres_history.sql", "postgres_session.sql")
_WAL_REFUSED = (
    asyncpg.InsufficientPrivilegeError,
    asyncpg.FeatureNotSupportedError,
    asyncpg.UndefinedFunctionError,
)
# A read's statements see one snapshot (REPEATABLE READ; READ COMMITTED would give each
# statement its own, and an effect read before a probe's receipt could meet the probe's
# event read after it). Read-only, it never fails to serialize. The same in
# postgres_history.sql's begin_checked_read_only.
_READ_ONLY = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
Queries = dict[str, tuple[str, list[str]]]


# Lanes are not cores: each more lane splits the same writes into more, smaller
# transactions, each with its own BEGIN, COMMIT, two history checks and WAL flush, and
# adds a server process contending for the database's cores. With the default pool of
# ten, three lanes instead of five cost PostgreSQL about a tenth less CPU per fenced
# write and the proxy about a twentieth less; two served fewer requests, four were
# between (bench/README.md, "Write lanes").
MAX_WRITE_LANES = 3


def write_lanes(pool: StorePool) -> int:
    """How many batches of writes run at once, each on a pool connection of its own: half
    the pool (rounded up: a pool of three has a lane for a write while another holds
    one), at most `MAX_WRITE_LANES`, the rest left for reads."""
    return max(1, min(MAX_WRITE_LANES, (pool.max_size + 1) // 2))


def load_positional_queries() -> Queries:
    """Every named query of this backend, with its parameters numbered for asyncpg."""
    return {
        name: to_positional(sql)
        for filename in QUERY_FILES
        for name, sql in load_queries(filename).items()
    }


def to_positional(sql: str) -> tuple[str, list[str]]:
    """`:name` parameters to asyncpg's `$n`, and the names in their positions."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _PARAM.sub(number, sql), names


async def _keep_session(conn: asyncpg.Connection) -> None:
    """A pooled connection's reset: nothing. asyncpg's default sends a reset query on
    every release (a round trip per transaction); this store leaves nothing in a
    session to reset: no LISTEN, no cursors or prepared statements of its own, no
    settings, and transaction-level advisory locks only (the migrations' too), which
    also keeps a pooler in transaction mode free to move the session between server
    connections. A transaction left open is rolled back by asyncpg before this is
    called."""


class PostgresTx:
    def __init__(
        self,
        conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy,
        queries: Queries,
        now: float,
        identify: Callable[[Any], None] | None = None,
    ) -> None:
        self._conn = conn
        self._queries = queries
        self.now = now
        # own_clock: the first row answered carries the store id, checked by this.
        self._identify = identify

    def _args(self, query: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
        sql, names = self._queries[query]
        return sql, [params[name] for name in names]

    async def _first_row(self, query: str, params: dict[str, Any]) -> asyncpg.Record | None:
        sql, args = self._args(query, params)
        row = await self._conn.fetchrow(sql, *args)
        if self._identify is not None:
            identify, self._identify = self._identify, None
            identify(None if row is None else row.get("store_id"))
        return row

    async def one(self, query: str, **params: Any) -> Row | None:
        row = await self._first_row(query, params)
        return dict(row) if row is not None else None

    async def values(self, query: str, **params: Any) -> Values | None:
        row = await self._first_row(query, params)
        return tuple(row) if row is not None else None

    async def all(self, query: str, **params: Any) -> list[Row]:
        sql, args = self._args(query, params)
        return [dict(row) for row in await self._conn.fetch(sql, *args)]

    async def execute(self, query: str, **params: Any) -> int:
        sql, args = self._args(query, params)
        status: str = await self._conn.execute(sql, *args)
        # "UPDATE 3", "INSERT 0 1", "DELETE 2", "SELECT 1": the count is the last word.
        last = status.rsplit(" ", 1)[-1]
        return int(last) if last.isdigit() else 0

    async def script(self, sql: str) -> None:
        # No parameters: one simple-query message, which may hold many statements.
        await self._conn.execute(sql, timeout=MIGRATION_TIMEOUT_S)


async def check_server(url: str, pool: StorePool, queries: Queries) -> None:
    """Refuse, with a `StoreError` that says why, a server this store must not write
    to: a hot standby, a read-only database, or a pooler in transaction mode while
    `store_pool.statement_cache` is on. A server that cannot be reached is not refused
    here: opening the store says that."""
    try:
        first = await _probe_connection(url, pool)
    except sqlstate.FAILURES:
        return
    try:
        await _refuse_read_only(PostgresTx(first, queries, math.nan))
        if pool.statement_cache:
            await _refuse_transaction_pooler(url, pool, first, queries)
    except sqlstate.FAILURES:
        return
    finally:
        await _close_probe(first)


async def _refuse_read_only(tx: PostgresTx) -> None:
    row = await tx.one("server_writable")
    assert row is not None
    if row["standby"]:
        raise StoreError(
            "this is a standby: the PostgreSQL server of the store URL is a hot standby "
            "(in recovery) and takes no writes; point `store` at the primary"
        )
    if row["read_only"]:
        raise StoreError(
            "the PostgreSQL database of the store URL is read-only "
            "(default_transaction_read_only is on): it takes no writes"
        )


# How many times two client connections compare their server backends.
POOLER_PROBES = 3


async def _probe_connection(url: str, pool: StorePool) -> asyncpg.Connection:
    return await asyncpg.connect(
        url,
        statement_cache_size=0,
        timeout=pool.command_timeout_s,
        command_timeout=pool.command_timeout_s,
    )


async def _refuse_transaction_pooler(
    url: str, pool: StorePool, first: asyncpg.Connection, queries: Queries
) -> None:
    """Two client connections open at once have two server backends, unless a pooler
    hands one server connection to each in turn between their transactions: that is
    transaction (or statement) pooling, where asyncpg's named statements collide. A
    busy pooler may hand out another idle server connection, so this can miss one;
    it never accuses a direct connection or a session pooler."""
    second = await _probe_connection(url, pool)
    try:
        mine, theirs = PostgresTx(first, queries, math.nan), PostgresTx(second, queries, math.nan)
        for _ in range(POOLER_PROBES):
            if await mine.one("backend_pid") == await theirs.one("backend_pid"):
                raise StoreError(
                    "the store URL reaches PostgreSQL through a pooler in transaction "
                    "mode (two connections were served by one server backend), where "
                    "prepared statements collide: set store_pool.statement_cache: false"
                )
    finally:
        await _close_probe(second)


async def _close_probe(conn: asyncpg.Connection) -> None:
    """Politely if the server answers, else at once: a probe that timed out must not
    hang the startup on its goodbye."""
    try:
        await conn.close(timeout=1.0)
    except sqlstate.FAILURES:
        conn.terminate()


class StoreConnection(CountingConnection):
    """A store connection that keeps the last history position its server told (a
    notice of `fenceproxy_history_position()`, in every checked BEGIN and COMMIT
    message), as the notice arrives.

    asyncpg hands every notice to `Connection._process_log_message`, a private method:
    overriding it is what keeps the check cheap. The public way, a log listener added
    and removed around every transaction, built a message object and scheduled a
    callback per notice, and cost the store's Python a few percent of a fenced write
    (bench/README.md). tests/integration/app/test_store_postgres.py pins that asyncpg
    still calls it. If it stopped, every checked transaction would be refused for
    telling nothing (the position is cleared at each BEGIN), never judged on a stale
    one."""

    told: tuple[history.Position, history.Position] | None = None

    def _process_log_message(self, fields: dict[str, str], last_query: str) -> None:
        told = history.parse_notice(fields.get("M", ""))
        if told is None:
            super()._process_log_message(fields, last_query)  # type: ignore[misc]
            return
        self.told = told

    def clear_told(self) -> None:
        self.told = None

    def take_told(self) -> tuple[history.Position, history.Position] | None:
        """(to judge, to keep), or None if nothing was told since the last take."""
        told, self.told = self.told, None
        return told


def store_connection_of(conn: asyncpg.pool.PoolConnectionProxy) -> StoreConnection:
    """The connection a pool's proxy stands for, to read and call: a proxy passes every
    attribute it does not have to its connection, which the pool opened as a
    `StoreConnection` (setting one on the proxy fails)."""
    return cast(StoreConnection, conn)


def _gone(conn: asyncpg.pool.PoolConnectionProxy) -> bool:
    """Closed, or already handed back to the pool, which a connection that broke is at
    once (its proxy then refuses every call)."""
    try:
        return conn.is_closed()
    except asyncpg.InterfaceError:
        return True


def _terminate(conn: asyncpg.pool.PoolConnectionProxy) -> None:
    with contextlib.suppress(asyncpg.InterfaceError):
        conn.terminate()


class _Lost(Exception):
    """The transaction found lost history and was rolled back: the store recovered (or
    found it recovered), and the operation may run again."""


class PostgresConnector:
    backend = "postgresql"

    def __init__(self, url: str, pool: StorePool | None = None) -> None:
        self.url = url
        self.pool = pool if pool is not None else StorePool(1, 10)
        self.min_size = self.pool.min_size
        self.max_size = self.pool.max_size
        self._queries = load_positional_queries()
        self._pool: asyncpg.Pool | None = None
        self.round_trips = RoundTrips()
        # The store id seen at open; once a transaction finds another, for good.
        self.store_id: str | None = None
        self.lost: str | None = None
        self.history = HistoryWatch()
        self.instance_id: str | None = None
        # Connections opened before the schema is current cannot read the history.
        self._ready = False
        self._writes: OperationQueue[_Write] | None = None

    # What the history watch last read (store/base.py Connector).
    @property
    def recovery(self) -> RecoveryWindow | None:
        return self.history.recovery

    @recovery.setter
    def recovery(self, window: RecoveryWindow | None) -> None:
        self.history.recovery = window

    @property
    def replication(self) -> Replication | None:
        return self.history.replication

    @replication.setter
    def replication(self, replication: Replication | None) -> None:
        self.history.replication = replication

    @property
    def writes_queued(self) -> int:
        return self._writes.queued if self._writes is not None else 0

    async def open(self) -> None:
        await check_server(self.url, self.pool, self._queries)
        try:
            self._pool = await asyncpg.create_pool(
                self.url,
                min_size=self.min_size,
                max_size=self.max_size,
                # 0: unnamed statements, parsed again for every execution (one more
                # round trip each), which a transaction-mode pooler cannot mix up.
                statement_cache_size=100 if self.pool.statement_cache else 0,
                command_timeout=self.pool.command_timeout_s,
                timeout=self.pool.command_timeout_s,
                connection_class=StoreConnection,
                init=self._connected,
                reset=_keep_session,
            )
        except sqlstate.FAILURES as exc:
            await self.close()
            raise _cannot_open(exc) from exc
        # A write waits for a lane as an operation waits for a pooled connection.
        self._writes = OperationQueue(
            "postgres-writer",
            self._write_batch,
            MAX_BATCH,
            write_lanes(self.pool),
            self.pool.acquire_timeout_s,
        )
        self._writes.start()

    async def change_schema(self, operation: SchemaOperation[T]) -> T:
        if self._pool is None:
            raise StoreUnavailable("the store is not open")
        try:
            acquired = self._pool.acquire(timeout=self.pool.acquire_timeout_s)
            async with acquired as conn, conn.transaction():
                return await operation(PostgresTx(conn, self._queries, math.nan))
        except sqlstate.FAILURES as exc:
            raise _cannot_open(exc) from exc

    async def ready(self) -> None:
        if self._pool is None:
            raise StoreUnavailable("the store is not open")
        try:
            self._ready = True
            async with self._pool.acquire(timeout=self.pool.acquire_timeout_s) as conn:
                # The connections opened before the schema was current are checked here.
                await self._check_history(conn)
                row = await PostgresTx(conn, self._queries, math.nan).one("store_id")
            assert row is not None
            self.store_id = str(row["store_id"])
            self.lost = None
        except sqlstate.FAILURES as exc:
            raise _cannot_open(exc) from exc

    async def _connected(self, conn: asyncpg.Connection) -> None:
        assert isinstance(conn, StoreConnection)
        conn.round_trips = self.round_trips
        if self._ready:
            # A new connection may reach another server than the last one did: a
            # promoted standby behind the same address. Every transaction checks again
            # (`_begin`); this also reads the store's record and the replication state.
            await self._check_history(conn)

    async def _check_history(
        self, conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy
    ) -> None:
        """What this connection's server says of its history, for the watch to judge
        (and recover from, on this connection). A standby in recovery is left for its
        first transaction to refuse (`_begin`)."""
        before = self.history.seen
        statements = PostgresTx(conn, self._queries, math.nan)
        try:
            row = await statements.one("history")
        except _WAL_REFUSED as exc:
            self.history.cannot_read_wal(exc)
            row = await statements.one("history_unchecked")
        except asyncpg.ObjectNotInPrerequisiteStateError:
            return  # recovery is in progress: a standby
        assert row is not None
        await self.history.connected(row, before, statements, self._transaction_on(conn))

    def _transaction_on(
        self, conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy
    ) -> Callable[[Operation[Any]], Any]:
        """Runs an operation in a transaction of its own on `conn` (the history watch's
        recovery, on the server that lost history): its time is the operation's to set."""

        async def transaction(operation: Operation[Any]) -> Any:
            async with conn.transaction():
                return await operation(PostgresTx(conn, self._queries, math.nan))

        return transaction

    async def _begin(self, conn: asyncpg.pool.PoolConnectionProxy, readonly: bool) -> None:
        """BEGIN, with the history check in the same message: a server in recovery, on
        another timeline than the last one seen, or whose WAL went back, serves nothing
        of this transaction. A loss is recovered at once (`_Lost`: run it again)."""
        if not self.history.checked:
            await conn.execute(_READ_ONLY if readonly else "BEGIN")
            return
        # What was seen before the BEGIN was sent is what its answer is judged against.
        before = self.history.seen
        heard = store_connection_of(conn)
        # Whatever this connection heard before (a notice outside a transaction, or a
        # COMMIT's whose answer was an error) must not stand in for what this BEGIN tells.
        heard.clear_told()
        try:
            await conn.execute(
                self._queries["begin_checked_read_only" if readonly else "begin_checked"][0]
            )
        except asyncpg.ObjectNotInPrerequisiteStateError as exc:
            # A standby (recovery is in progress): this connection is not for the store;
            # the pool opens another, to whichever server answers then.
            _terminate(conn)
            raise StoreUnavailable(
                "the store's PostgreSQL server is a standby in recovery: it is not used "
                "until it is promoted (and its history checked)"
            ) from exc
        except BaseException:
            await self._rollback(conn)
            raise
        told = heard.take_told()
        if told is None:
            await self._rollback(conn)
            raise StoreUnavailable("the store's server did not tell its WAL position")
        loss = self.history.opened(told, before)
        if loss is None:
            return
        await self._rollback(conn)
        await self.history.recover(self._transaction_on(conn), loss)
        raise _Lost(loss.reason)

    async def _commit(self, conn: asyncpg.pool.PoolConnectionProxy) -> None:
        if not self.history.checked:
            await conn.execute("COMMIT")
            return
        await conn.execute(self._queries["commit_checked"][0])
        self.history.committed(store_connection_of(conn).take_told())

    @staticmethod
    async def _rollback(conn: asyncpg.pool.PoolConnectionProxy) -> None:
        """Roll back the failed transaction, for the caller to raise what failed it; a
        connection that cannot be rolled back (it broke, or this was cancelled) is
        never reused."""
        if _gone(conn):
            return
        try:
            await conn.execute("ROLLBACK")
        except asyncio.CancelledError:
            _terminate(conn)
            raise
        except Exception:
            _terminate(conn)

    async def close(self) -> None:
        """Runs the writes queued, then closes the pool."""
        if self._writes is not None:
            await self._writes.stop()
            self._writes = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        self._ready = False

    async def _transaction(
        self,
        conn: asyncpg.pool.PoolConnectionProxy,
        body: Callable[[], Coroutine[Any, Any, T]],
        readonly: bool,
    ) -> T:
        """`body`'s statements as one transaction: BEGIN and COMMIT, each with the history
        check; rolled back if it raises."""
        await self._begin(conn, readonly)
        try:
            result = await body()
        except BaseException:
            await self._rollback(conn)
            raise
        try:
            await self._commit(conn)
        except sqlstate.FAILURES as exc:
            # The COMMIT was sent: a failure that is not the server's answer leaves
            # the transaction's fate unknown.
            if not readonly and sqlstate.unavailable(exc):
                raise CommitUnknown(
                    "PostgreSQL's answer to the COMMIT was lost "
                    f"({sqlstate.describe(exc)}): it may have committed"
                ) from exc
            raise
        return result

    async def _step(
        self, conn: asyncpg.pool.PoolConnectionProxy, operation: Operation[T], own_clock: bool
    ) -> T:
        """One operation's statements in the open transaction, at its own time: read when
        it starts (`clock`), or by its first statement (`own_clock`), never the
        transaction's start, which was earlier for all but a batch's first."""
        tx = PostgresTx(conn, self._queries, math.nan, self._identify)
        if not own_clock:
            clock = await tx.one("clock")
            assert clock is not None
            tx.now = float(clock["now"])
        return await operation(tx)

    def _lose(self, what: str) -> str:
        self.lost = (
            f"the database is no longer the store opened (store id {self.store_id}; {what}): "
            "it was dropped and created again or replaced, so nothing more is acknowledged "
            "(restart the proxy)"
        )
        return self.lost

    def _identify(self, found: Any) -> None:
        """The store id the first row of an own_clock transaction answered."""
        if found != self.store_id:
            raise StoreUnavailable(self._lose(f"now {found}"))

    async def write(
        self,
        operation: Operation[T],
        own_clock: bool = False,
        resource: str | None = None,
        left: Left | None = None,
    ) -> T:
        write = _Write(operation, own_clock, statement=False, resource=resource)
        return cast(T, await self._submit(write, left))

    async def read(self, operation: Operation[T]) -> T:
        return await self._run(operation, readonly=True)

    async def statement(self, query: str, **params: Any) -> Values | None:
        """One round trip when it runs alone: a single statement is a transaction of its
        own. In a batch, one statement of the batch's transaction."""

        async def operation(tx: Tx) -> Values | None:
            return await tx.values(query, **params, store_id=self.store_id)

        write = _Write(operation, True, statement=True, resource=params.get("resource"))
        return cast(Values | None, await self._submit(write))

    async def _submit(self, write: _Write, left: Left | None = None) -> Any:
        if self._writes is None:
            raise StoreUnavailable("the store is not open")
        if self.lost is not None:
            raise StoreUnavailable(self.lost)
        return await self._writes.submit(write, left)

    async def _write_batch(self, writes: list[_Write]) -> list[Outcome]:
        """Writes that queued together, in one transaction, in the order of the
        resources they lock (`_lock_order`); if that failed before its COMMIT, each
        again alone, so that one write's failure (its own error, a conflict, a
        deadlock with another batch) is nobody else's answer. Their outcomes in the
        order they came."""
        if len(writes) == 1:
            return [await self._alone(writes[0])]
        order = sorted(range(len(writes)), key=lambda n: _lock_order(writes[n]))
        in_order = [writes[n] for n in order]
        outcomes = await self._together(in_order)
        if outcomes is None:
            outcomes = [await self._alone(write) for write in in_order]
        answered = dict(zip(order, outcomes, strict=True))
        return [answered[n] for n in range(len(writes))]

    async def _alone(self, write: _Write) -> Outcome:
        try:
            return True, await self._run(
                write.operation,
                readonly=False,
                own_clock=write.own_clock,
                transaction=not write.statement,
            )
        except BaseException as exc:
            if being_cancelled(exc):
                raise
            return False, exc

    async def _together(self, writes: list[_Write]) -> list[Outcome] | None:
        """The writes as one transaction, in order, each at its own time, or None: the
        transaction failed before its COMMIT and was rolled back (nothing of it kept).
        The COMMIT's answer lost: every write's `CommitUnknown`. No connection to be
        had, or the one had broke: every write's `StoreUnavailable`, as each alone
        would have met (and waited for) the same."""
        assert self._pool is not None  # the lanes run only while the store is open

        async def body() -> list[Outcome]:
            outcomes: list[Outcome] = []
            for write in writes:
                if outcomes and write.resource is not None:
                    failpoints.reach(failpoints.MID_BATCH)
                outcomes.append((True, await self._step(conn, write.operation, write.own_clock)))
            return outcomes

        try:
            async with self._pool.acquire(timeout=self.pool.acquire_timeout_s) as conn:
                return await self._transaction(conn, body, readonly=False)
        except CommitUnknown as exc:
            return [(False, exc)] * len(writes)
        except sqlstate.CONNECTION_LOST as exc:
            return [(False, self._translated(exc))] * len(writes)
        except BaseException as exc:
            if being_cancelled(exc):
                raise
            return None

    async def _run(
        self,
        operation: Operation[T],
        readonly: bool,
        own_clock: bool = False,
        transaction: bool = True,
    ) -> T:
        if self._pool is None:
            raise StoreUnavailable("the store is not open")
        if self.lost is not None:
            raise StoreUnavailable(self.lost)
        for attempt in range(RETRIES):
            try:
                async with self._pool.acquire(timeout=self.pool.acquire_timeout_s) as conn:
                    if not transaction:
                        return await operation(
                            PostgresTx(conn, self._queries, math.nan, self._identify)
                        )
                    return await self._transaction(
                        conn, lambda: self._step(conn, operation, own_clock), readonly
                    )
            except _Lost:
                if attempt < RETRIES - 1:
                    continue
                raise StoreUnavailable("the store lost history and recovered; try again") from None
            except sqlstate.FAILURES as exc:
                if sqlstate.should_retry(exc) and attempt < RETRIES - 1:
                    continue
                raise self._translated(exc) from exc
        raise AssertionError("unreachable")

    def _translated(self, exc: BaseException) -> StoreError:
        """A driver's error as the store's."""
        if isinstance(exc, asyncpg.UndefinedTableError | asyncpg.UndefinedFunctionError):
            # The schema is gone under the open pool (the database was recreated), its
            # functions with it.
            return StoreUnavailable(self._lose(f"its tables are gone: {exc}"))
        if sqlstate.should_retry(exc):
            return StoreUnavailable("the transaction kept conflicting; try again")
        if sqlstate.unavailable(exc):
            return StoreUnavailable(
                f"PostgreSQL did not answer or refused: {sqlstate.describe(exc)}"
            )
        return StoreError(f"PostgreSQL refused the operation: {exc}")


@dataclass(frozen=True)
class _Write:
    """A write for the lanes: its operation, whether its first statement answers the
    time (`own_clock`), whether it is a single statement (`Connector.statement`:
    alone, a transaction of its own, without BEGIN and COMMIT), and the resource whose
    lock it takes first, if known (its place in a batch, `_lock_order`)."""

    operation: Operation[Any]
    own_clock: bool
    statement: bool
    resource: str | None


def _lock_order(write: _Write) -> tuple[bool, str]:
    """Where a write runs in its batch: those that name the resource they lock first,
    by resource (so two batches, of this replica's lanes or another's, take those
    locks in one order and never deadlock on them), then those that do not; Python's
    sort is stable, so writes to one resource keep the order they queued in."""
    return write.resource is None, write.resource or ""


def _cannot_open(exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(f"cannot open the PostgreSQL store: {sqlstate.describe(exc)}")
