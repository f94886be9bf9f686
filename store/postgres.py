"""PostgreSQL backend through asyncpg, for several proxy replicas sharing one authority.

Each operation is one transaction on a pooled connection. Decisions about a
resource take its row lock first (the `lock_resource` query), so two replicas
never both grant a live lease or admit writes under different epochs. Time is
the database's (`now()` at the start of the transaction), so replicas with
skewed clocks still agree on when a lease expires.

A fenced request is five round trips: its admission is BEGIN, one call
that locks and reads (`own_clock`: it answers the time and the store id itself),
one write, COMMIT; its receipt one statement that is its own transaction
(`statement`). Every round trip is counted (`round_trips`) for the bench and tests.

Every transaction checks the database's history (store/history.py) in the BEGIN and
COMMIT messages it sends anyway: a standby in recovery serves none, and a server on
another timeline than the last seen, or behind the position seen, is recovered from
(`_recover`, the same fencing as `store fence-restore`) before the transaction runs.

Driver errors are translated here, by what store/sqlstate.py says they mean: nothing
above the store sees asyncpg.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
from collections.abc import Callable
from typing import Any

import asyncpg

from policies.model import StorePool
from store import history, sqlstate
from store.base import CommitUnknown, Operation, Row, StoreError, StoreUnavailable, T, Tx
from store.history import FAILOVER_EPOCH_ADVANCE, Position, RecoveryWindow, Replication
from store.housekeeping import fence_all
from store.queries import load_migrations, load_queries

log = logging.getLogger("fenceproxy")

# Serialization failures and deadlocks mean "nothing happened, try again".
RETRIES = 3
MIGRATION_LOCK = 7431000
# A migration rewrites whole tables: not bound by store_pool.command_timeout_s.
MIGRATION_TIMEOUT_S = 24 * 3600.0
# The authority's clock: the database's, shared by every replica (see store_meta); and,
# in the same round trip, the store's id, so that every transaction checks it is still
# talking to the store it opened: a database dropped and created again behind the same
# URL would hand out epochs from 1.
_NOW = (
    "SELECT extract(epoch FROM now())::float8 + m.clock_offset_s AS now, i.store_id"
    " FROM store_meta m, store_identity i"
)
_WAL_REFUSED = (
    asyncpg.InsufficientPrivilegeError,
    asyncpg.FeatureNotSupportedError,
    asyncpg.UndefinedFunctionError,
)
# Every transaction's BEGIN and COMMIT messages carry the history check (migration
# 0018): simple-query messages, which return no rows but deliver the position as a
# notice, so the check costs no round trip. At BEGIN: judged before the transaction's
# first statement is sent; on a standby in recovery it raises. In the COMMIT message,
# just before the COMMIT: this transaction's own id, kept once the COMMIT returned, so
# that a restore that loses it is found on the next transaction, on any connection.
_BEGIN = "BEGIN; SELECT fenceproxy_history_position()"
_BEGIN_READ_ONLY = "BEGIN READ ONLY; SELECT fenceproxy_history_position()"
_COMMIT = "SELECT fenceproxy_history_position(); COMMIT"
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def to_positional(sql: str) -> tuple[str, list[str]]:
    """`:name` parameters to asyncpg's `$n`, and the names in their positions."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _PARAM.sub(number, sql), names


class RoundTrips:
    """Every exchange with the server a connector's connections made: each statement,
    BEGIN, COMMIT and ROLLBACK (asyncpg sends each as one message and waits for its
    answer). Not counted: preparing a statement, once per connection per statement
    (asyncpg caches it), or before every execution with `store_pool.statement_cache`
    off (one more exchange per statement), and opening connections. Read by the bench
    and the tests."""

    def __init__(self) -> None:
        self.count = 0


class CountingConnection(asyncpg.Connection):
    """A connection that counts its round trips (in `round_trips`, set by its pool's
    init). Every statement of asyncpg's public API, a transaction's BEGIN and COMMIT
    included, goes through one of these methods."""

    round_trips: RoundTrips | None = None

    def _count(self) -> None:
        if self.round_trips is not None:
            self.round_trips.count += 1

    # The overridden methods' options (timeout, record_class, column) pass through.
    async def execute(self, query: str, *args: Any, **options: Any) -> str:
        self._count()
        result: str = await super().execute(query, *args, **options)
        return result

    async def fetch(self, query: str, *args: Any, **options: Any) -> list[Any]:
        self._count()
        result: list[Any] = await super().fetch(query, *args, **options)
        return result

    async def fetchrow(self, query: str, *args: Any, **options: Any) -> Any:
        self._count()
        return await super().fetchrow(query, *args, **options)

    async def fetchval(self, query: str, *args: Any, **options: Any) -> Any:
        self._count()
        return await super().fetchval(query, *args, **options)


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
        queries: dict[str, tuple[str, list[str]]],
        now: float,
        identify: Callable[[Row], None] | None = None,
    ) -> None:
        self._conn = conn
        self._queries = queries
        self.now = now
        # own_clock: the first row answered carries the store id, checked by this.
        self._identify = identify

    def _args(self, query: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
        sql, names = self._queries[query]
        return sql, [params[name] for name in names]

    async def one(self, query: str, **params: Any) -> Row | None:
        sql, args = self._args(query, params)
        row = await self._conn.fetchrow(sql, *args)
        found = dict(row) if row is not None else None
        if self._identify is not None:
            identify, self._identify = self._identify, None
            identify(found or {})
        return found

    async def all(self, query: str, **params: Any) -> list[Row]:
        sql, args = self._args(query, params)
        return [dict(row) for row in await self._conn.fetch(sql, *args)]

    async def execute(self, query: str, **params: Any) -> int:
        sql, args = self._args(query, params)
        status: str = await self._conn.execute(sql, *args)
        # "UPDATE 3", "INSERT 0 1", "DELETE 2", "SELECT 1": the count is the last word.
        last = status.rsplit(" ", 1)[-1]
        return int(last) if last.isdigit() else 0


async def check_server(url: str, pool: StorePool) -> None:
    """Refuse, with a `StoreError` that says why, a server this store must not write
    to: a hot standby, a read-only database, or a pooler in transaction mode while
    `store_pool.statement_cache` is on. A server that cannot be reached is not refused
    here: opening the store says that."""
    try:
        first = await _probe_connection(url, pool)
    except sqlstate.FAILURES:
        return
    try:
        await _refuse_read_only(first)
        if pool.statement_cache:
            await _refuse_transaction_pooler(url, pool, first)
    except sqlstate.FAILURES:
        return
    finally:
        await _close_probe(first)


async def _refuse_read_only(conn: asyncpg.Connection) -> None:
    row = await conn.fetchrow(
        "SELECT pg_is_in_recovery() AS standby,"
        " current_setting('transaction_read_only') = 'on' AS read_only"
    )
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


async def _refuse_transaction_pooler(url: str, pool: StorePool, first: asyncpg.Connection) -> None:
    """Two client connections open at once have two server backends, unless a pooler
    hands one server connection to each in turn between their transactions: that is
    transaction (or statement) pooling, where asyncpg's named statements collide. A
    busy pooler may hand out another idle server connection, so this can miss one;
    it never accuses a direct connection or a session pooler."""
    second = await _probe_connection(url, pool)
    try:
        for _ in range(POOLER_PROBES):
            mine = await first.fetchval("SELECT pg_backend_pid()")
            theirs = await second.fetchval("SELECT pg_backend_pid()")
            if mine == theirs:
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


def _window(row: Any) -> RecoveryWindow | None:
    opened = row["recovery_opened_at"]
    return None if opened is None else RecoveryWindow(float(opened), str(row["recovery_reason"]))


class _Heard:
    """The last history position a connection's server told (a notice of
    `fenceproxy_history_position()`), for the one transaction that holds it."""

    def __init__(self) -> None:
        self.position: tuple[Position, Position] | None = None

    def __call__(self, _conn: object, message: Any) -> None:
        told = history.parse_notice(str(message.message))
        if told is not None:
            self.position = told

    def take(self) -> tuple[Position, Position] | None:
        """(to judge, to keep), or None if nothing was told since the last take."""
        told, self.position = self.position, None
        return told


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
    def __init__(self, url: str, pool: StorePool | None = None) -> None:
        self.url = url
        self.pool = pool if pool is not None else StorePool(1, 10)
        self.min_size = self.pool.min_size
        self.max_size = self.pool.max_size
        queries = {**load_queries("postgres.sql"), **load_queries("postgres_history.sql")}
        self._queries = {name: to_positional(sql) for name, sql in queries.items()}
        self._pool: asyncpg.Pool | None = None
        self.round_trips = RoundTrips()
        # The store id seen at open; once a transaction finds another, for good.
        self.store_id: str | None = None
        self.lost: str | None = None
        # The recovery window as last read from the store (store/history.py).
        self.recovery: RecoveryWindow | None = None
        self.replication: Replication | None = None
        # The newest WAL position this process saw: a later one behind it went back,
        # one on another timeline is another history.
        self._seen: Position | None = None
        # The highest epoch floor this process set or found in a recovery: a recovery on
        # a database that never saw it (an old primary come back) raises past it.
        self._floor = 0
        # Connections opened before the migrations cannot read the history columns.
        self._migrated = False
        # False where the WAL functions are refused: transactions are not checked.
        self._guarded = False
        self._unchecked_said = False

    async def open(self) -> None:
        await check_server(self.url, self.pool)
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
                connection_class=CountingConnection,
                init=self._count_round_trips,
                reset=_keep_session,
            )
            await self.migrate()
            self._migrated = True
            async with self._pool.acquire(timeout=self.pool.acquire_timeout_s) as conn:
                # The connections opened before the migrations are checked here.
                await self._check_history(conn)
            self.store_id = await self._pool.fetchval("SELECT store_id FROM store_identity")
            self.lost = None
        except sqlstate.FAILURES as exc:
            await self.close()
            raise StoreUnavailable(
                f"cannot open the PostgreSQL store: {sqlstate.describe(exc)}"
            ) from exc

    async def _count_round_trips(self, conn: asyncpg.Connection) -> None:
        assert isinstance(conn, CountingConnection)
        conn.round_trips = self.round_trips
        if self._migrated:
            # A new connection may reach another server than the last one did: a
            # promoted standby behind the same address. Every transaction
            # checks again (`_begin`); this also reads the store's record and the
            # replication state.
            await self._check_history(conn)

    async def _check_history(
        self, conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy
    ) -> None:
        """Has the database lost what this store acknowledged? If so, recover at once
        (raise every epoch, end every lease, open the recovery window) before this
        connection serves anything; and note the recovery window either way. A standby
        in recovery is left for its first transaction to refuse (`_begin`)."""
        before = self._seen  # as in `_begin`
        try:
            row = await conn.fetchrow(self._queries["history"][0])
        except _WAL_REFUSED as exc:
            # A role or a service that may not read the WAL position: no check.
            self._warn_unchecked(exc)
            row = await conn.fetchrow(self._queries["history_unchecked"][0])
        except asyncpg.ObjectNotInPrerequisiteStateError:
            return  # recovery is in progress: a standby
        assert row is not None
        self.recovery = _window(row)
        self.replication = history.replication_of(dict(row))
        if row["walfile"] is None:
            self._guarded = False
            return
        self._guarded = True
        inserted = history.parse_position(row["walfile"], row["inserted"])
        current = Position(inserted.timeline, inserted.lsn, int(row["next_xid"]))
        recorded = row["history_timeline"]
        lost = history.judge(recorded, current, before)
        if lost is not None:
            await self._recover(conn, current, lost)
            return
        if recorded is None:
            sql, _ = self._queries["record_history_timeline"]
            await conn.execute(sql, current.timeline)
        self._seen = history.advance(
            self._seen, history.parse_position(row["walfile"], row["flushed"])
        )

    def _warn_unchecked(self, exc: Exception) -> None:
        if not self._unchecked_said:
            self._unchecked_said = True
            log.warning(
                "the WAL position cannot be read (%s): a failover that lost history "
                "cannot be detected; after one, run `fenceproxy store fence-restore` and "
                "restart every replica",
                exc,
            )

    async def _recover(
        self,
        conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy,
        current: Position,
        lost: str,
    ) -> None:
        """As `store fence-restore` (the same function), in one transaction with the
        recovery window opened: every epoch past anything the lost history could have
        issued, every lease ended; unless another replica already recovered on this
        very server, to floors at least as high as this process saw."""
        async with conn.transaction():
            sql, _ = self._queries["history_for_recovery"]
            row = await conn.fetchrow(sql)
            assert row is not None
            server = history.Server(current.timeline, float(row["server_started"]))
            recorded = None
            if row["history_timeline"] is not None and row["history_server_started"] is not None:
                recorded = history.Server(
                    int(row["history_timeline"]), float(row["history_server_started"])
                )
            if history.recovered_on(recorded, server) and int(row["epoch_floor"]) >= self._floor:
                self.recovery = _window(row)
                self._floor = int(row["epoch_floor"])
                self._seen = Position(current.timeline, 0)
                return
            tx = PostgresTx(conn, self._queries, float(row["now"]))
            floor = await fence_all(tx, FAILOVER_EPOCH_ADVANCE, "failover", self._floor)
            await tx.execute(
                "record_recovery",
                timeline=current.timeline,
                server_started=server.started,
                now=tx.now,
                reason=lost,
            )
        self.recovery = RecoveryWindow(tx.now, lost)
        self._floor = floor
        # Kept again from the next transaction's (flushed, crash-safe) positions.
        self._seen = Position(current.timeline, 0)
        log.warning(
            "the store lost history (%s): every epoch was raised to %d, every lease ended, "
            "and the recovery window opened",
            lost,
            floor,
        )

    async def _begin(
        self, conn: asyncpg.pool.PoolConnectionProxy, heard: _Heard, readonly: bool
    ) -> None:
        """BEGIN, with the history check in the same message: a server in recovery, on
        another timeline than the last one seen, or whose WAL went back, serves nothing
        of this transaction. A loss is recovered at once (`_Lost`: run it again)."""
        if not self._guarded:
            await conn.execute("BEGIN READ ONLY" if readonly else "BEGIN")
            return
        # Judged against what was seen before the BEGIN was sent: a COMMIT that returns
        # meanwhile, on another connection, may have been after this server's answer.
        before = self._seen
        try:
            await conn.execute(_BEGIN_READ_ONLY if readonly else _BEGIN)
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
        told = heard.take()
        if told is None:
            await self._rollback(conn)
            raise StoreUnavailable("the store's server did not tell its WAL position")
        current, kept = told
        lost = history.judge(None, current, before)
        if lost is None:
            self._seen = history.advance(self._seen, kept)
            return
        await self._rollback(conn)
        await self._recover(conn, current, lost)
        raise _Lost(lost)

    async def _commit(self, conn: asyncpg.pool.PoolConnectionProxy, heard: _Heard) -> None:
        if not self._guarded:
            await conn.execute("COMMIT")
            return
        await conn.execute(_COMMIT)
        told = heard.take()
        if told is not None and self._seen is not None and self._seen.timeline == told[1].timeline:
            self._seen = history.advance(self._seen, told[1])

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
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def migrate(self) -> list[int]:
        """Apply missing migrations, one replica at a time; returns the versions applied.
        All of them in one transaction, under a transaction-level advisory lock: a lock
        that outlived its transaction would be held by whichever client a pooler in
        transaction mode gives that server connection to next."""
        assert self._pool is not None
        applied_now = []
        acquired = self._pool.acquire(timeout=self.pool.acquire_timeout_s)
        async with acquired as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY,"
                " name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
            for version, name, sql in load_migrations("postgresql"):
                if version in done:
                    continue
                await conn.execute(sql, timeout=MIGRATION_TIMEOUT_S)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    version,
                    name,
                )
                applied_now.append(version)
        return applied_now

    async def _transaction(
        self,
        conn: asyncpg.pool.PoolConnectionProxy,
        operation: Operation[T],
        readonly: bool,
        own_clock: bool,
    ) -> T:
        heard = _Heard()
        # Only while this transaction holds the connection (asyncpg warns of a listener
        # left on a connection released to the pool).
        conn.add_log_listener(heard)
        try:
            await self._begin(conn, heard, readonly)
            try:
                if own_clock:
                    result = await operation(
                        PostgresTx(conn, self._queries, math.nan, self._identify)
                    )
                else:
                    row = await conn.fetchrow(_NOW)
                    self._identify(dict(row) if row is not None else {})
                    assert row is not None
                    result = await operation(PostgresTx(conn, self._queries, float(row["now"])))
            except BaseException:
                await self._rollback(conn)
                raise
            try:
                await self._commit(conn, heard)
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
        finally:
            # Even from a closed connection: the pool warns of a listener left on one
            # handed back. A proxy already handed back (the connection broke) refuses.
            with contextlib.suppress(asyncpg.InterfaceError):
                conn.remove_log_listener(heard)

    def _lose(self, what: str) -> str:
        self.lost = (
            f"the database is no longer the store opened (store id {self.store_id}; {what}): "
            "it was dropped and created again or replaced, so nothing more is acknowledged "
            "(restart the proxy)"
        )
        return self.lost

    def _identify(self, row: Row) -> None:
        found = row.get("store_id")
        if found != self.store_id:
            raise StoreUnavailable(self._lose(f"now {found}"))

    async def write(self, operation: Operation[T], own_clock: bool = False) -> T:
        return await self._run(operation, readonly=False, own_clock=own_clock)

    async def read(self, operation: Operation[T]) -> T:
        return await self._run(operation, readonly=True)

    async def statement(self, query: str, **params: Any) -> Row | None:
        """One round trip: a single statement is a transaction of its own."""

        async def operation(tx: Tx) -> Row | None:
            return await tx.one(query, **params, store_id=self.store_id)

        return await self._run(operation, readonly=False, own_clock=True, transaction=False)

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
                    return await self._transaction(conn, operation, readonly, own_clock)
            except _Lost:
                if attempt < RETRIES - 1:
                    continue
                raise StoreUnavailable("the store lost history and recovered; try again") from None
            except (asyncpg.UndefinedTableError, asyncpg.UndefinedFunctionError) as exc:
                # The schema is gone under the open pool (the database was recreated),
                # its functions (migration 0013) with it.
                raise StoreUnavailable(self._lose(f"its tables are gone: {exc}")) from exc
            except sqlstate.FAILURES as exc:
                if sqlstate.should_retry(exc):
                    if attempt < RETRIES - 1:
                        continue
                    raise StoreUnavailable("the transaction kept conflicting; try again") from None
                if sqlstate.unavailable(exc):
                    raise StoreUnavailable(
                        f"PostgreSQL did not answer or refused: {sqlstate.describe(exc)}"
                    ) from exc
                raise StoreError(f"PostgreSQL refused the operation: {exc}") from exc
        raise AssertionError("unreachable")
