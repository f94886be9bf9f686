"""What the CLI asks of a store outside a running `Store`: the schema versions it
has, and a consistent copy of a SQLite store.

Both open the database on their own connection, so they work with or without
proxies running on it.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import asyncpg

from policies.store_backends import StoreBackend, store_backend
from store.base import StoreError, StoreUnavailable
from store.queries import load_queries
from store.sqlite import parse_sqlite_url


async def schema_versions(url: str) -> set[int]:
    """The migrations applied to the store at `url`; empty for a store not created yet."""
    if store_backend(url) is StoreBackend.SQLITE:
        path, _ = parse_sqlite_url(url)
        if not path.exists():
            return set()
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as reader:
                applied = load_queries("sqlite.sql")["applied_migrations"]
                return {row[0] for row in reader.execute(applied)}
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return set()
            raise StoreUnavailable(f"cannot read {path}: {exc}") from exc
    try:
        conn = await asyncpg.connect(url)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise StoreUnavailable(f"cannot open the PostgreSQL store: {exc}") from exc
    try:
        applied = load_queries("postgres.sql")["applied_migrations"]
        return {row["version"] for row in await conn.fetch(applied)}
    except asyncpg.UndefinedTableError:
        return set()
    finally:
        await conn.close()


def backup_sqlite(url: str, target: Path) -> None:
    """Copy the SQLite store at `url` to `target` with SQLite's online backup API.

    The copy is one consistent snapshot, committed transactions still in the `-wal`
    file included, taken while proxies go on writing (a plain `cp` of the main file
    misses what is in the `-wal`). It is written beside `target` and renamed into
    place, so `target` is never a half-written database.
    """
    if store_backend(url) is not StoreBackend.SQLITE:
        raise StoreError(
            "store backup copies a SQLite store; back up PostgreSQL with pg_dump "
            "(docs/how-to/backup-restore.md)"
        )
    source_path, _ = parse_sqlite_url(url)
    if not source_path.exists():
        raise StoreError(f"{source_path}: no such database")
    if target.exists():
        raise StoreError(f"{target} exists; choose a new file (a backup never overwrites)")
    if not target.parent.is_dir():
        raise StoreError(f"{target.parent}: no such folder; create it first")
    partial = target.with_name(f"{target.name}.partial")
    try:
        with (
            contextlib.closing(sqlite3.connect(f"file:{source_path}?mode=ro", uri=True)) as source,
            contextlib.closing(sqlite3.connect(partial)) as copy,
        ):
            source.execute("PRAGMA busy_timeout = 10000")
            source.backup(copy)
            # The copy stands alone: one file, no -wal beside it.
            copy.execute("PRAGMA journal_mode = DELETE")
        partial.replace(target)
    except (sqlite3.Error, OSError) as exc:
        partial.unlink(missing_ok=True)
        raise StoreError(f"backup of {source_path} to {target} failed: {exc}") from exc
