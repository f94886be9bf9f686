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
# A clock move waits at most this long for a lock on store_meta (never expected).
LOCK_TIMEOUT = "5s"
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
