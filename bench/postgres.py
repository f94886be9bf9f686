"""The benchmark's own PostgreSQL database: created fresh on the server an admin URL
names, dropped afterwards, and the server processes that serve it."""

from __future__ import annotations

import secrets
from urllib.parse import urlsplit, urlunsplit

import asyncpg

PREFIX = "fenceproxy_bench_"
CONNECT_TIMEOUT_S = 10.0


class DatabaseUnavailable(RuntimeError):
    """The admin URL's server cannot be reached or refused to create the database."""


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


async def _admin(admin_url: str) -> asyncpg.Connection:
    try:
        return await asyncpg.connect(admin_url, timeout=CONNECT_TIMEOUT_S)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
        raise DatabaseUnavailable(f"PostgreSQL at {admin_url} cannot be reached: {exc}") from exc


async def create_database(admin_url: str) -> str:
    """Create `fenceproxy_bench_<random>`; returns its URL."""
    name = PREFIX + secrets.token_hex(5)
    conn = await _admin(admin_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    except asyncpg.PostgresError as exc:
        raise DatabaseUnavailable(f"cannot create database {name}: {exc}") from exc
    finally:
        await conn.close()
    return with_database(admin_url, name)


async def drop_database(admin_url: str, url: str) -> None:
    name = urlsplit(url).path.lstrip("/")
    if not name.startswith(PREFIX):
        raise ValueError(f"{name!r} is not a benchmark database")
    conn = await _admin(admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def backend_pids(admin_url: str, url: str) -> list[int]:
    """The server processes connected to the database `url` names right now."""
    name = urlsplit(url).path.lstrip("/")
    conn = await _admin(admin_url)
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            name,
        )
    finally:
        await conn.close()
    return [int(row["pid"]) for row in rows]
