"""The PostgreSQL store behind pgbouncer (started by the tests, tests/pgbouncer.py),
and the store when the server says no.

Behind a pooler in transaction mode, asyncpg's named statements collide across server
connections: with `store_pool.statement_cache: false` two replicas work through one,
with it on the store refuses to open. Every refusal of the server or the pooler (a
read-only database, too many connections, statement_timeout, a full pool) is
`StoreUnavailable` (503 `store_unavailable`), never a bare `StoreError` (a 500).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from core.records import Refusal
from policies import StorePool
from store import Store, StoreError, StoreUnavailable, open_store
from tests import pg
from tests.pgbouncer import Bouncer

pg_url = pg.database_fixture()

PROJECT_ROOT = Path(__file__).resolve().parents[3]
NO_CACHE = StorePool(1, 4, statement_cache=False)
_serial = itertools.count()


def token_hash() -> str:
    return hashlib.sha256(f"pooler-token-{next(_serial)}".encode()).hexdigest()


@asynccontextmanager
async def running(
    url: str, pool: StorePool, instance_id: str = "replica-1"
) -> AsyncIterator[Store]:
    store = open_store(url, time.time, instance_id, pool)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def migrated(url: str) -> None:
    """The schema in place, so that a later open has no migration to run."""
    async with running(url, StorePool(1, 1)):
        pass


async def replica_traffic(store: Store, name: str, rounds: int) -> list[str]:
    """Acquires, reads and heartbeats of one replica; the failures, as text."""
    failures = []
    for number in range(rounds):
        try:
            result = await store.acquire(f"{name}-{number}", name, 30, token_hash())
            assert not isinstance(result, Refusal), result
            await store.lease_view(f"{name}-{number}")
            await store.heartbeat()
        except StoreError as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
    return failures


async def two_replicas(url: str, pool: StorePool) -> list[str]:
    async with running(url, pool, "replica-1") as one, running(url, pool, "replica-2") as two:
        results = await asyncio.gather(
            *(replica_traffic(one, f"a{n}", 15) for n in range(4)),
            *(replica_traffic(two, f"b{n}", 15) for n in range(4)),
        )
    return [failure for failures in results for failure in failures]


# -- pgbouncer -------------------------------------------------------------------------


async def test_two_replicas_work_through_a_transaction_pooler_without_the_cache(
    pg_url: str,
) -> None:
    with Bouncer("transaction", pool_size=2) as bouncer:
        url = bouncer.url(pg_url)
        assert await two_replicas(url, NO_CACHE) == []


async def test_named_statements_collide_through_a_transaction_pooler(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the cache must be off there: with it on (and the startup check skipped),
    the same traffic fails, and every failure is store_unavailable, not a bug."""
    monkeypatch.setattr("store.postgres.POOLER_PROBES", 0)
    with Bouncer("transaction", pool_size=2) as bouncer:
        url = bouncer.url(pg_url)
        await migrated(url)
        failures = await two_replicas(url, StorePool(1, 4))
    assert failures, "named statements did not collide"
    assert all(failure.startswith("StoreUnavailable") for failure in failures), failures


async def test_a_transaction_pooler_with_the_cache_on_is_refused_at_open(pg_url: str) -> None:
    with Bouncer("transaction") as bouncer:
        store = open_store(bouncer.url(pg_url), time.time, "replica-1", StorePool(1, 4))
        with pytest.raises(StoreError, match=r"store_pool\.statement_cache: false"):
            await store.open()


async def test_a_session_pooler_keeps_the_cache(pg_url: str) -> None:
    with Bouncer("session") as bouncer:
        assert await two_replicas(bouncer.url(pg_url), StorePool(1, 4)) == []


async def test_migrations_leave_no_advisory_lock_behind(pg_url: str) -> None:
    """Through a transaction pooler a session lock would stay on a server connection
    that the next client gets: the migrations' lock ends with their transaction."""
    with Bouncer("transaction", pool_size=1) as bouncer:
        async with running(bouncer.url(pg_url), NO_CACHE):
            conn = await asyncpg.connect(pg_url)
            try:
                held = await conn.fetchval(
                    "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
                    " WHERE l.locktype = 'advisory' AND d.datname = current_database()"
                )
            finally:
                await conn.close()
    assert held == 0


def test_every_advisory_lock_of_the_store_is_transaction_scoped() -> None:
    """A session-level lock (or an unlock, which only they need) anywhere in the
    store's code or SQL would break behind a transaction pooler."""
    session_level = ("pg_advisory_lock", "pg_try_advisory_lock", "pg_advisory_unlock")
    sources = [
        *(PROJECT_ROOT / "store").glob("*.py"),
        *(PROJECT_ROOT / "store").glob("*.sql"),
        *(PROJECT_ROOT / "store" / "migrations" / "postgresql").glob("*.sql"),
    ]
    found = [
        f"{path.name}: {name}"
        for path in sources
        for name in session_level
        if f"{name}(" in path.read_text()
    ]
    assert found == []
    assert "pg_advisory_xact_lock(" in (PROJECT_ROOT / "store" / "postgres.sql").read_text()


async def test_a_full_session_pool_is_store_unavailable_in_command_timeout(pg_url: str) -> None:
    """pgbouncer (session mode) with one server connection, held by a transaction: the
    other replica's statements wait for it, and give up after command_timeout_s, as
    503 store_unavailable (readiness's heartbeat included), not after 120 s."""
    pool = StorePool(1, 1, command_timeout_s=0.5)
    with Bouncer("session", pool_size=1) as bouncer:
        url = bouncer.url(pg_url)
        await migrated(pg_url)
        holder = await asyncpg.connect(url, statement_cache_size=0)
        try:
            await holder.execute("BEGIN")
            store = open_store(url, time.time, "replica-2", pool)
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await store.open()
            assert time.monotonic() - started < 5
        finally:
            await holder.close()


async def test_no_free_connection_is_store_unavailable_in_acquire_timeout(pg_url: str) -> None:
    """Every connection of the pool busy: the next operation waits acquire_timeout_s,
    then is store_unavailable; readiness's heartbeat says the same."""
    pool = StorePool(1, 1, acquire_timeout_s=0.3)
    async with running(pg_url, pool) as store:
        release, holding = asyncio.Event(), asyncio.Event()

        async def hold(tx: object) -> None:
            holding.set()
            await release.wait()

        busy = asyncio.create_task(store.connector.write(hold))
        try:
            # In its transaction: a write queued at the same moment would share it.
            await holding.wait()
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="in time"):
                await store.heartbeat()
            assert 0.25 <= time.monotonic() - started < 3
            with pytest.raises(StoreUnavailable):
                await store.acquire("r", "w", 30, token_hash())
        finally:
            release.set()
            await busy
        await store.heartbeat()


async def test_the_poolers_own_refusal_is_store_unavailable(pg_url: str) -> None:
    """pgbouncer at max_client_conn refuses the login (SQLSTATE 08P01)."""
    with Bouncer("transaction", max_client_conn=1) as bouncer:
        url = bouncer.url(pg_url)
        await migrated(pg_url)
        other = await asyncpg.connect(url, statement_cache_size=0)
        try:
            store = open_store(url, time.time, "replica-1", NO_CACHE)
            with pytest.raises(StoreUnavailable, match="08P01"):
                await store.open()
        finally:
            await other.close()


# -- the server says no ----------------------------------------------------------------


async def admin(sql: str) -> None:
    await database_admin(pg.require_admin_url(), sql)


async def database_admin(url: str, sql: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def test_a_database_set_read_only_mid_run_is_store_unavailable(pg_url: str) -> None:
    name = pg.database_name(pg_url)
    async with running(pg_url, StorePool(1, 2)) as store:
        await store.heartbeat()
        await admin(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
        # The setting reaches new sessions: end the pool's.
        await admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        )
        refusals: list[StoreUnavailable] = []
        for _ in range(3):
            with pytest.raises(StoreUnavailable) as refused:
                await store.acquire("r", "w", 30, token_hash())
            refusals.append(refused.value)
        with pytest.raises(StoreUnavailable, match="read-only"):
            await store.heartbeat()
    assert "read-only" in str(refusals[-1])


async def test_a_read_only_database_is_refused_at_open_as_read_only(pg_url: str) -> None:
    await migrated(pg_url)
    await admin(f"ALTER DATABASE {pg.database_name(pg_url)} SET default_transaction_read_only = on")
    store = open_store(pg_url, time.time, "replica-1", StorePool(1, 2))
    with pytest.raises(StoreError, match="is read-only") as refused:
        await store.open()
    assert not isinstance(refused.value, StoreUnavailable)


async def test_too_many_connections_is_store_unavailable(pg_url: str) -> None:
    """A role at its connection limit (SQLSTATE 53300, as max_connections gives)."""
    role = f"{pg.PREFIX}{secrets.token_hex(6)}"
    await migrated(pg_url)
    await admin(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 1")
    try:
        await database_admin(pg_url, f"GRANT ALL ON SCHEMA public TO {role}")
        await database_admin(pg_url, f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        await database_admin(pg_url, f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
        parts = urlsplit(pg_url)
        url = urlunsplit(
            (parts.scheme, f"{role}@{parts.hostname}:{parts.port}", parts.path, "", "")
        )
        release, holding = asyncio.Event(), asyncio.Event()

        async def hold(tx: object) -> None:
            holding.set()
            await release.wait()

        async with running(url, StorePool(1, 3)) as store:
            busy = asyncio.create_task(store.connector.write(hold))
            try:
                # In its transaction: a write queued at the same moment would share it.
                await holding.wait()
                with pytest.raises(StoreUnavailable, match="53300"):
                    await store.heartbeat()
            finally:
                release.set()
                await busy
    finally:
        await admin(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
        )
        # Its grants live in the test's database; they go with it after the role.
        await database_admin(pg_url, f"DROP OWNED BY {role}")
        await admin(f"DROP ROLE {role}")


async def test_statement_timeout_is_store_unavailable(pg_url: str) -> None:
    """A DBA's statement_timeout fires while an acquire waits for a row lock."""
    async with running(pg_url, StorePool(1, 2)) as store:
        result = await store.acquire("r", "w", 30, token_hash())
        assert not isinstance(result, Refusal), result
    await admin(f"ALTER DATABASE {pg.database_name(pg_url)} SET statement_timeout = '200ms'")
    locker = await asyncpg.connect(pg_url)
    try:
        await locker.execute("BEGIN")
        await locker.execute("SELECT * FROM resources WHERE resource = 'r' FOR UPDATE")
        async with running(pg_url, StorePool(1, 2)) as store:
            with pytest.raises(StoreUnavailable, match="57014"):
                await store.acquire("r", "w2", 30, token_hash())
    finally:
        await locker.close()
