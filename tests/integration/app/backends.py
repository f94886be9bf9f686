"""The two store backends the app suite runs on, and what the tests need of each.

* SQLite: a file under the test's tmp_path; time is the injected `FakeClock`.
* PostgreSQL: one database per test run (tests/pg.py creates it on the server named
  by FENCEPROXY_TEST_POSTGRES_URL and drops it at the end), and one *schema* per test
  in it, selected by the store URL's ``?search_path=`` (asyncpg passes unknown query
  parameters on as server settings). A schema costs a few milliseconds where a
  database costs far more. The authority's time is the database's ``now()`` plus
  ``store_meta.clock_offset_s``, so a test moves time by raising that offset, for
  every connection and every replica at once.

The direct reads (`rows`) and clock moves open their own connection: they see only
what the store committed, as another process would.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import re
import secrets
import sqlite3
from collections.abc import Coroutine
from typing import Any, Final, Literal, TypeVar
from urllib.parse import urlencode, urlsplit, urlunsplit

import asyncpg

from store.sqlite import parse_sqlite_url

T = TypeVar("T")
Backend = Literal["sqlite", "postgresql"]
BACKENDS: Final[tuple[Backend, ...]] = ("sqlite", "postgresql")
SCHEMA_PREFIX = "t_"
CONNECT_TIMEOUT_S = 10.0
# A clock move waits at most this long for the lock on store_meta. A retention pass
# holds it while it records how far its sweep of resources got, which on a loaded
# machine took over 5 s once; a wait that long still fails rather than hangs.
LOCK_TIMEOUT = "30s"
_PLACEHOLDER = re.compile(r"\?")


def backend_of(store_url: str) -> Backend:
    return "sqlite" if store_url.startswith("sqlite:") else "postgresql"


def schema_url(database_url: str, schema: str) -> str:
    """The database URL with ``search_path`` set to `schema` (other query kept)."""
    parts = urlsplit(database_url)
    query = "&".join(q for q in (parts.query, urlencode({"search_path": schema})) if q)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion on a thread of its own (with its own event loop),
    so that sync code, even inside the test's running loop, can talk to PostgreSQL."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _connect(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(url, timeout=CONNECT_TIMEOUT_S)


async def create_schema_async(database_url: str) -> str:
    """A new empty schema in the run's database; returns the store URL that uses it."""
    schema = SCHEMA_PREFIX + secrets.token_hex(6)
    conn = await _connect(database_url)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    finally:
        await conn.close()
    return schema_url(database_url, schema)


def create_schema(database_url: str) -> str:
    return run_sync(create_schema_async(database_url))


async def _advance_authority(store_url: str, seconds: float) -> None:
    conn = await _connect(store_url)
    try:
        await conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        status = await conn.execute(
            "UPDATE store_meta SET clock_offset_s = clock_offset_s + $1", seconds
        )
    finally:
        await conn.close()
    assert status == "UPDATE 1", f"store_meta of {store_url} has no row: {status}"


def advance_authority(store_url: str, seconds: float) -> None:
    """Move a PostgreSQL store's clock (its store_meta.clock_offset_s) forward by `seconds`.

    Sync, so that `FakeClock.advance` stays sync; it returns once the move is committed,
    so every transaction that starts afterwards, in any replica, sees the new time.
    """
    run_sync(_advance_authority(store_url, seconds))


def _positional(sql: str) -> str:
    """SQLite's ``?`` placeholders as PostgreSQL's ``$1, $2, ...``."""
    counter = iter(range(1, 1000))
    return _PLACEHOLDER.sub(lambda _: f"${next(counter)}", sql)


async def rows(store_url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read the store's tables directly, on a separate connection closed at once.

    `sql` is written with ``?`` placeholders and must be valid on both backends.
    """
    if backend_of(store_url) == "sqlite":
        path, _ = parse_sqlite_url(store_url)
        with contextlib.closing(sqlite3.connect(path)) as sqlite_conn:
            return [tuple(row) for row in sqlite_conn.execute(sql, params).fetchall()]
    pg_conn = await _connect(store_url)
    try:
        return [tuple(record) for record in await pg_conn.fetch(_positional(sql), *params)]
    finally:
        await pg_conn.close()


# -- seeding many records at once (retention and index tests) -------------------------

_SEED_EFFECTS = {
    "sqlite": """
        WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < :count)
        INSERT INTO effects (id, route, resource, holder, epoch, idempotency_key, fingerprint,
                             method, path, state, instance_id, created_at, deadline,
                             finished_at, upstream_status, reason, retain_s)
        SELECT :prefix || printf('%08d', i), 'place-order', :resource || (i % 1000), 'seed',
               1, :prefix || printf('%08d', i), 'fp-seed', 'POST', '/orders/seed', :state,
               'seed', :finished_at - 1, :finished_at + 4, :finished_at, 201, 'seeded', 60
        FROM n
    """,
    "postgresql": """
        INSERT INTO effects (id, route, resource, holder, epoch, idempotency_key, fingerprint,
                             method, path, state, instance_id, created_at, deadline,
                             finished_at, upstream_status, reason, retain_s)
        SELECT $1::text || lpad(i::text, 8, '0'), 'place-order', $2::text || (i % 1000),
               'seed', 1, $1::text || lpad(i::text, 8, '0'), 'fp-seed', 'POST',
               '/orders/seed', $3::text, 'seed', $4::float8 - 1, $4::float8 + 4, $4::float8,
               201, 'seeded', 60
        FROM generate_series(0, $5 - 1) AS i
    """,
}
# Every `every`-th seeded effect gets one event, and one idempotency record.
_SEED_EVENTS = {
    "sqlite": """
        INSERT INTO effect_events (effect_id, at, kind, actor, upstream_status, conclusion,
                                   detail)
        SELECT id, finished_at, 'probe', 'seed', 200, 'committed', 'seeded' FROM effects
        WHERE id LIKE :prefix || '%'
          AND CAST(substr(id, length(:prefix) + 1) AS INTEGER) % :every = 0
    """,
    "postgresql": """
        INSERT INTO effect_events (effect_id, at, kind, actor, upstream_status, conclusion,
                                   detail)
        SELECT id, finished_at, 'probe', 'seed', 200, 'committed', 'seeded' FROM effects
        WHERE id LIKE $1::text || '%' AND substr(id, length($1::text) + 1)::int % $2 = 0
    """,
}
_SEED_KEYS = {
    "sqlite": """
        INSERT INTO idempotency (resource, key, fingerprint, effect_id, epoch, expires_at,
                                 response_status, response_headers, response_body)
        SELECT resource, id, fingerprint, id, 1, :expires_at, 201, '[]', X'7B7D' FROM effects
        WHERE id LIKE :prefix || '%'
          AND CAST(substr(id, length(:prefix) + 1) AS INTEGER) % :every = 0
    """,
    "postgresql": """
        INSERT INTO idempotency (resource, key, fingerprint, effect_id, epoch, expires_at,
                                 response_status, response_headers, response_body)
        SELECT resource, id, fingerprint, id, 1, $3::float8, 201, '[]', '\\x7b7d'::bytea
        FROM effects
        WHERE id LIKE $1::text || '%' AND substr(id, length($1::text) + 1)::int % $2 = 0
    """,
}
# One kind of refusal each (distinct epochs of one resource in 1000, a holder a call):
# as many rows.
_SEED_REFUSALS = {
    "sqlite": """
        WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < :count)
        INSERT INTO refusals (resource, code, route, epoch, holder, client, count, first_seen,
                              last_seen, method, path, fingerprint)
        SELECT :resource || (i % 1000), 'stale_epoch', 'place-order', i + 1, :holder, '', 1,
               :at, :at, 'POST', '/orders/seed', 'fp-seed'
        FROM n
    """,
    "postgresql": """
        INSERT INTO refusals (resource, code, route, epoch, holder, client, count, first_seen,
                              last_seen, method, path, fingerprint)
        SELECT $2::text || (i % 1000), 'stale_epoch', 'place-order', i + 1, $4::text, '', 1,
               $1::float8, $1::float8, 'POST', '/orders/seed', 'fp-seed'
        FROM generate_series(0, $3 - 1) AS i
    """,
}


async def _seed(store_url: str, statements: list[tuple[str, dict[str, Any], list[Any]]]) -> None:
    """Run (SQLite named parameters, PostgreSQL positional ones) statements in one
    transaction, on a connection of their own."""
    if backend_of(store_url) == "sqlite":
        path, _ = parse_sqlite_url(store_url)
        with contextlib.closing(sqlite3.connect(path)) as sqlite_conn, sqlite_conn:
            sqlite_conn.execute("PRAGMA foreign_keys = ON")
            for sql, named, _ in statements:
                sqlite_conn.execute(sql, named)
        return
    pg_conn = await _connect(store_url)
    try:
        async with pg_conn.transaction():
            for sql, _, positional in statements:
                await pg_conn.execute(sql, *positional)
    finally:
        await pg_conn.close()


async def seed_settled_effects(
    store_url: str,
    count: int,
    *,
    finished_at: float,
    prefix: str = "eff_seed_",
    state: str = "COMMITTED",
    resource: str = "seed:r",
    every: int = 10,
    key_expires_at: float | None = None,
) -> None:
    """`count` effects in `state` that finished at `finished_at`, with one INSERT ... SELECT
    (not through the API): ids `prefix` + 8 digits, spread over 1000 resources. Every
    `every`-th also has an event and, if `key_expires_at` is given, an idempotency
    record that expires then."""
    backend = backend_of(store_url)
    statements: list[tuple[str, dict[str, Any], list[Any]]] = [
        (
            _SEED_EFFECTS[backend],
            {
                "count": count,
                "prefix": prefix,
                "resource": resource,
                "state": state,
                "finished_at": finished_at,
            },
            [prefix, resource, state, finished_at, count],
        ),
        (_SEED_EVENTS[backend], {"prefix": prefix, "every": every}, [prefix, every]),
    ]
    if key_expires_at is not None:
        statements.append(
            (
                _SEED_KEYS[backend],
                {"prefix": prefix, "every": every, "expires_at": key_expires_at},
                [prefix, every, key_expires_at],
            )
        )
    await _seed(store_url, statements)


async def seed_refusals(store_url: str, count: int, *, at: float, resource: str = "seed:r") -> None:
    """`count` kinds of refusal on record, each last seen at `at`, with one INSERT ... SELECT."""
    backend = backend_of(store_url)
    holder = "seed-" + secrets.token_hex(4)
    named = {"count": count, "at": at, "resource": resource, "holder": holder}
    await _seed(store_url, [(_SEED_REFUSALS[backend], named, [at, resource, count, holder])])


_SEED_RESOURCES = {
    "sqlite": """
        WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < :count)
        INSERT INTO resources (resource, epoch) SELECT :prefix || i, :epoch FROM n
    """,
    "postgresql": """
        INSERT INTO resources (resource, epoch)
        SELECT $1::text || i, $2::bigint FROM generate_series(0, $3 - 1) AS i
    """,
}
_SEED_LEASES = {
    "sqlite": """
        INSERT INTO leases (resource, epoch, holder, token_hash, granted_at, expires_at,
                            ended_at, end_reason)
        SELECT resource, epoch, 'seed', 'seed-' || resource, :ended_at - 60, :ended_at + 30,
               :ended_at, 'released'
        FROM resources WHERE resource LIKE :prefix || '%'
    """,
    "postgresql": """
        INSERT INTO leases (resource, epoch, holder, token_hash, granted_at, expires_at,
                            ended_at, end_reason)
        SELECT resource, epoch, 'seed', 'seed-' || resource, $2::float8 - 60, $2::float8 + 30,
               $2::float8, 'released'
        FROM resources WHERE resource LIKE $1::text || '%'
    """,
}


async def seed_released_leases(
    store_url: str, count: int, *, prefix: str, epoch: int, ended_at: float
) -> None:
    """`count` resources named `prefix` + a number, each with one lease at `epoch`
    released at `ended_at` (as acquire and release would leave them), with one
    INSERT ... SELECT each."""
    backend = backend_of(store_url)
    resources = {"prefix": prefix, "epoch": epoch, "count": count}
    leases = {"prefix": prefix, "ended_at": ended_at}
    await _seed(
        store_url,
        [
            (_SEED_RESOURCES[backend], resources, [prefix, epoch, count]),
            (_SEED_LEASES[backend], leases, [prefix, ended_at]),
        ],
    )


async def count(store_url: str, table: str, where: str = "TRUE") -> int:
    """Rows of `table` (a name of ours, never input) matching `where`."""
    found = await rows(store_url, f"SELECT count(*) FROM {table} WHERE {where}")
    return int(found[0][0])


def commit_now(store_url: str, sql: str) -> None:
    """One statement (no parameters, valid on both backends), committed on a connection
    of its own before this returns, without suspending the caller."""
    if backend_of(store_url) == "sqlite":
        path, _ = parse_sqlite_url(store_url)
        with contextlib.closing(sqlite3.connect(path)) as sqlite_conn, sqlite_conn:
            sqlite_conn.execute(sql)
        return
    run_sync(execute(store_url, sql))


async def execute(store_url: str, sql: str) -> None:
    """One statement (no parameters, valid on both backends), committed."""
    await _seed(store_url, [(sql, {}, [])])
