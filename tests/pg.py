"""A fresh PostgreSQL database per test (or per module), for every PostgreSQL test.

The server comes from the environment variable FENCEPROXY_TEST_POSTGRES_URL, an
*admin* URL (a role that may CREATE DATABASE), for example
``postgresql://postgres@127.0.0.1:5432/postgres``.

* Unset: PostgreSQL tests are skipped, with a reason naming the variable.
* Set: they must run. A server that cannot be reached, or refuses to create a
  database, fails the test loudly (`PostgresUnavailable`); it is never skipped.

Each database is named ``fenceproxy_t_<random hex>`` on the admin URL's server and
is dropped afterwards, also when connections are still open (``WITH (FORCE)``).

Use the fixture factory in a test module or conftest::

    from tests import pg

    pg_url = pg.database_fixture()                  # one database per test
    pg_module_url = pg.database_fixture("module")   # one per module

    def test_something(pg_url: str) -> None: ...

or the plain functions (`create_database`, `drop_database`), which work in sync
code and inside a running event loop alike (the driver runs on its own thread),
or their `*_async` twins in async code.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import secrets
from collections.abc import Coroutine, Iterator
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

ENV = "FENCEPROXY_TEST_POSTGRES_URL"
PREFIX = "fenceproxy_t_"
CONNECT_TIMEOUT_S = 10.0
SKIP_REASON = f"PostgreSQL tests need {ENV} (an admin URL, e.g. postgresql://postgres@127.0.0.1:5432/postgres)"

T = TypeVar("T")


class PostgresUnavailable(RuntimeError):
    """FENCEPROXY_TEST_POSTGRES_URL is set but the server cannot serve the tests."""


def admin_url() -> str | None:
    """The admin URL from the environment, or None when PostgreSQL tests are off."""
    return os.environ.get(ENV) or None


def require_admin_url() -> str:
    """The admin URL; skips the calling test (with the reason) when it is not set."""
    url = admin_url()
    if url is None:
        pytest.skip(SKIP_REASON)
    return url


def database_url(url: str, name: str) -> str:
    """`url` with its database (path) replaced by `name`; user, host, port, query kept."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


async def create_database_async(admin: str | None = None, template: str | None = None) -> str:
    """Create ``fenceproxy_t_<random>`` (optionally as a copy of database `template`,
    which must have no open connections) and return its URL."""
    admin = admin or require_admin_url()
    name = PREFIX + secrets.token_hex(6)
    statement = f'CREATE DATABASE "{name}"'
    if template is not None:
        statement += f' TEMPLATE "{_checked(template)}"'
    await _admin_execute(admin, statement)
    return database_url(admin, name)


async def drop_database_async(url: str, admin: str | None = None) -> None:
    """Drop the database `url` names (a test database only), closing its connections."""
    name = _checked(database_name(url))
    admin = admin or admin_url() or database_url(url, "postgres")
    await _admin_execute(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def create_database(admin: str | None = None, template: str | None = None) -> str:
    """`create_database_async`, callable from sync code or from inside an event loop."""
    return _run(create_database_async(admin, template))


def drop_database(url: str, admin: str | None = None) -> None:
    """`drop_database_async`, callable from sync code or from inside an event loop."""
    _run(drop_database_async(url, admin))


def database_fixture(
    scope: Literal["function", "module", "package", "session"] = "function",
) -> Any:
    """A pytest fixture yielding the URL of a fresh database, dropped afterwards.

    Assign it to the name the tests ask for: ``pg_url = pg.database_fixture()``.
    """

    @pytest.fixture(scope=scope)
    def fixture() -> Iterator[str]:
        admin = require_admin_url()
        url = create_database(admin)
        try:
            yield url
        finally:
            drop_database(url, admin)

    return fixture


def _checked(name: str) -> str:
    # Only our own databases are created from or dropped: never a real one by mistake.
    if not name.startswith(PREFIX) or not name.replace("_", "").isalnum():
        raise ValueError(f"{name!r} is not a test database ({PREFIX}<hex>)")
    return name


async def _admin_execute(admin: str, statement: str) -> None:
    # CREATE/DROP DATABASE run outside a transaction, connected to another database
    # than the one they create or drop: the admin URL's own.
    try:
        conn = await asyncpg.connect(admin, timeout=CONNECT_TIMEOUT_S)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
        raise PostgresUnavailable(
            f"{ENV} is set, but PostgreSQL at {_safe(admin)} cannot be reached: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    try:
        await conn.execute(statement)
    except asyncpg.PostgresError as exc:
        raise PostgresUnavailable(
            f"PostgreSQL at {_safe(admin)} refused {statement!r}: {exc}"
        ) from exc
    finally:
        await conn.close()


def _safe(url: str) -> str:
    """The URL without a password, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{parts.username}@{host}" if parts.username else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _run(coro: Coroutine[Any, Any, T]) -> T:
    # A thread of its own has no running loop, whatever the caller's thread has.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
